// The checkpoint manifest (meta.json): the training state, the optimizer's kind and
// scalars, and the size and CRC32 of every file, checksummed as a whole. Parsed here from
// text, apart from the directory handling in checkpoint_manager.cc, so that tests and the
// fuzzer can feed it bytes directly.
#pragma once

#include <cstdint>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <string_view>

#include "kolo/checkpoint.h"

namespace kolo::checkpoint::detail {

inline constexpr const char* kManifestFormat = "kolo-checkpoint-1";

/// Size and checksum of one file of the checkpoint, as the manifest records them.
struct ManifestFile {
  uint64_t bytes = 0;
  uint32_t crc32 = 0;
};

/// The optimizer the state in optimizer.safetensors belongs to.
struct ManifestOptimizer {
  std::string kind;
  std::map<std::string, double> scalars;
};

/// A parsed and checked manifest.
struct Manifest {
  TrainingState state;
  /// File name (plain, no directories) -> recorded size and CRC32.
  std::map<std::string, ManifestFile> files;
  std::optional<ManifestOptimizer> optimizer;
};

/// CRC32 of the manifest's canonical dump without its "manifest_crc32" field.
uint32_t manifestCrc(nlohmann::json manifest);

/// Parses meta.json's text. Throws FormatError naming `dir` when the text is not JSON (or
/// nests too deeply), is not a kolo-checkpoint-1 manifest, fails its checksum, lacks a
/// field or holds one of the wrong type or range (negative or fractional step, a CRC
/// beyond 32 bits), lists no `modelFile`, or lists a file name with a directory part.
Manifest parseManifest(std::string_view text, const std::string& dir, const std::string& modelFile);

}  // namespace kolo::checkpoint::detail
