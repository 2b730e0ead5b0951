// parseNpz: an .npz archive's arrays from bytes in memory (loadNpz maps the file first); in a
// header of its own so that the fuzz harness reaches it without the file system.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "kolo/data_files.h"

namespace kolo::data {

/// The arrays of the .npz bytes [data, data + size) that `owner` keeps alive, as loadNpz
/// returns them; `path` names the archive in messages.
std::vector<std::pair<std::string, NpyArray>> parseNpz(std::shared_ptr<const void> owner, const uint8_t* data,
                                                       size_t size, const std::string& path);

}  // namespace kolo::data
