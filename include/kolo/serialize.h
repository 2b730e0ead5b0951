// A module's state dict (parameters and buffers) saved to and loaded from one safetensors
// file: kolo::save / kolo::load, as torch::save / torch::load of a module. They live in the
// checkpoint layer (above nn), which owns the file format.
#pragma once

#include <string>

#include "kolo/nn/module.h"

namespace kolo {

/// Writes module.stateDict() to `path` as safetensors, under PyTorch's state_dict names
/// (torch and Hugging Face tools read it). Atomic (see checkpoint::saveSafetensors): readers
/// see the old file or the new one. Throws IoError naming the path when writing fails.
void save(const nn::Module& module, const std::string& path);

/// Reads `path` into the module's parameters and buffers in place (values converted to
/// their dtypes). Throws IoError when the file cannot be read, FormatError naming it when it
/// is not valid safetensors, and InvalidArgument "cannot load <path>:" listing each name the
/// module has and the file lacks, each name the file has and the module lacks, and each
/// shape that differs; nothing is copied unless every check passes.
void load(nn::Module& module, const std::string& path);

}  // namespace kolo
