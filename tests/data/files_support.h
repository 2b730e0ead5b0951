// What the file readers' tests share: a scratch directory per test, and Python (with NumPy)
// run to write the files the readers are compared against, so a file is made by the
// format's own tools, not by the code under test.
#pragma once

#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

namespace kolo::data::testing {

/// A fresh directory under the system's temporary one, removed with the object.
class ScratchDir {
 public:
  ScratchDir() {
    std::string pattern = (std::filesystem::temp_directory_path() / "kolo-data-XXXXXX").string();
    path_ = ::mkdtemp(pattern.data());
  }
  ~ScratchDir() { std::filesystem::remove_all(path_); }
  std::string operator/(const std::string& name) const { return path_ + "/" + name; }
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

/// Whether Debian's /usr/bin/python3 with NumPy can be run (tests that need it skip, saying so, without).
inline bool havePythonNumpy() {
  static const bool have = std::system("/usr/bin/python3 -c 'import numpy' >/dev/null 2>&1") == 0;
  return have;
}

/// Runs the Python `script` in `dir` (its working directory); fails the test with the
/// script's output when it exits non-zero.
inline void runPython(const std::string& dir, const std::string& script) {
  const std::string file = dir + "/make.py";
  std::ofstream(file) << "import numpy as np\n" << script;
  const std::string command = "cd '" + dir + "' && /usr/bin/python3 make.py > make.log 2>&1";
  if (std::system(command.c_str()) != 0) {
    std::ifstream log(dir + "/make.log");
    FAIL() << "python3 failed:\n" << std::string(std::istreambuf_iterator<char>(log), {});
  }
}

/// The bytes of `path` as elements of T (raw little-endian, as NumPy's tofile writes them).
template <class T>
std::vector<T> readRaw(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::vector<char> bytes((std::istreambuf_iterator<char>(in)), {});
  std::vector<T> values(bytes.size() / sizeof(T));
  std::memcpy(values.data(), bytes.data(), values.size() * sizeof(T));
  return values;
}

#define KOLO_SKIP_WITHOUT_NUMPY()                                                          \
  do {                                                                                     \
    if (!::kolo::data::testing::havePythonNumpy()) GTEST_SKIP() << "python3-numpy missing"; \
  } while (0)

}  // namespace kolo::data::testing
