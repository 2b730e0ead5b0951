// Named tensors on disk in the safetensors format (what PyTorch and Hugging Face tools read):
// an 8-byte little-endian header length, a JSON header mapping each name to dtype, shape
// and data_offsets (plus an optional "__metadata__" string map), then the raw data.
#pragma once

#include <map>
#include <string>
#include <utility>
#include <vector>

#include "kolo/tensor.h"

namespace kolo::checkpoint {

/// Tensors with their names, in order (a module's namedParameters(), for instance).
using NamedTensors = std::vector<std::pair<std::string, Tensor>>;

/// The contents of a safetensors file: tensors in the order of their data in the file.
struct SafetensorsFile {
  NamedTensors tensors;
  std::map<std::string, std::string> metadata;
  /// The tensor called `name`, or an undefined tensor.
  Tensor find(const std::string& name) const;
};

/// Writes `tensors` (any dtype kolo has; non-contiguous views are packed) to `path` in this
/// order, with `metadata` as "__metadata__". Atomic: writes `path`.tmp.<pid>, fsyncs it and
/// renames it over `path`, so readers see the old file or the new one, never a mix.
/// Throws InvalidArgument for duplicate or empty names, IoError when writing fails.
void saveSafetensors(const std::string& path, const NamedTensors& tensors,
                     const std::map<std::string, std::string>& metadata = {});

/// Reads a whole safetensors file. Throws IoError when it cannot be read and FormatError
/// naming the file when the header length, the JSON, a dtype, a shape or the data offsets
/// are wrong, or the file is truncated.
SafetensorsFile loadSafetensors(const std::string& path);

/// Copies tensors from `file` into `targets` by name (values converted to the target dtype).
/// With `strict`, every target must be present and the file may hold nothing else. Throws
/// InvalidArgument listing missing or unexpected names, or a wrong shape as
/// "0.weight: file has [512, 784], model expects [256, 784]"; `source` names the file in
/// messages. Nothing is copied unless every check passes.
void copyIntoTensors(const SafetensorsFile& file, const NamedTensors& targets, bool strict = true,
                     const std::string& source = "safetensors file");

/// loadSafetensors(path) followed by copyIntoTensors: loads weights into existing parameters
/// (e.g. module.namedParameters()) in place.
void loadSafetensorsInto(const std::string& path, const NamedTensors& targets, bool strict = true);

}  // namespace kolo::checkpoint
