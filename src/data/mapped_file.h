// A file mapped read-only into memory, shared by the readers that index into it (NumPy
// arrays, .npz members, token files, CSV text) so that a sample is read where it lies instead
// of being copied whole at open.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

namespace kolo::data::detail {

class MappedFile {
 public:
  /// Maps `path` read-only (an empty file maps to no bytes). Throws FileError naming the
  /// path when it cannot be opened or mapped, or is a directory.
  static std::shared_ptr<const MappedFile> open(const std::string& path);
  ~MappedFile();
  MappedFile(const MappedFile&) = delete;
  MappedFile& operator=(const MappedFile&) = delete;

  const uint8_t* data() const { return data_; }
  size_t size() const { return size_; }
  const std::string& path() const { return path_; }

 private:
  MappedFile() = default;
  const uint8_t* data_ = nullptr;
  size_t size_ = 0;
  std::string path_;
};

}  // namespace kolo::data::detail
