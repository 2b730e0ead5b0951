// Inputs for the parser regression tests: every file of a harness's seed corpus
// (fuzz/corpus/<harness>_fuzz) and of the inputs that once crashed or hung a parser
// (tests/fixtures/fuzz_regressions/<parser>), in the byte format the harness reads.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include "kolo/error.h"

namespace kolo::fuzz_regressions {

struct Input {
  std::string name;
  std::vector<uint8_t> bytes;
};

inline std::vector<Input> readFolder(const std::filesystem::path& folder) {
  std::vector<Input> inputs;
  if (!std::filesystem::is_directory(folder)) return inputs;
  for (const auto& entry : std::filesystem::directory_iterator(folder)) {
    if (!entry.is_regular_file()) continue;
    std::ifstream in(entry.path(), std::ios::binary);
    inputs.push_back({entry.path().string(), std::vector<uint8_t>(std::istreambuf_iterator<char>(in),
                                                                  std::istreambuf_iterator<char>())});
  }
  std::sort(inputs.begin(), inputs.end(), [](const Input& a, const Input& b) { return a.name < b.name; });
  return inputs;
}

/// The seed corpus of harness `<parser>_fuzz`.
inline std::vector<Input> seedInputs(const std::string& parser) {
  return readFolder(std::filesystem::path(KOLO_SOURCE_DIR) / "fuzz" / "corpus" / (parser + "_fuzz"));
}

/// The inputs that once made `parser` crash, hang or break an invariant.
inline std::vector<Input> regressionInputs(const std::string& parser) {
  return readFolder(std::filesystem::path(KOLO_SOURCE_DIR) / "tests" / "fixtures" / "fuzz_regressions" /
                    parser);
}

/// Runs `parse` on every input: each must parse or throw a kolo::Error, nothing else.
/// Returns how many parsed.
template <class Parse>
int expectParsesOrThrowsError(const std::vector<Input>& inputs, Parse&& parse) {
  int parsed = 0;
  for (const Input& input : inputs) {
    SCOPED_TRACE(input.name);
    try {
      parse(input.bytes);
      ++parsed;
    } catch (const Error&) {
    } catch (const std::exception& e) {
      ADD_FAILURE() << "threw a non-kolo exception: " << e.what();
    }
  }
  return parsed;
}

/// Runs `fn` and returns the message of the FormatError it throws (fails otherwise).
template <class Fn>
std::string formatErrorOf(Fn&& fn) {
  try {
    fn();
  } catch (const FormatError& e) {
    return e.what();
  } catch (const std::exception& e) {
    ADD_FAILURE() << "expected FormatError, got: " << e.what();
    return "";
  }
  ADD_FAILURE() << "expected FormatError, nothing was thrown";
  return "";
}

}  // namespace kolo::fuzz_regressions
