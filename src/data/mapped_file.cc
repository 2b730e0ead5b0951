// MappedFile: mmap of a whole file, unmapped when the last reader lets it go.
#include "data/mapped_file.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "kolo/error.h"

namespace kolo::data::detail {

std::shared_ptr<const MappedFile> MappedFile::open(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) KOLO_THROW(FileError, "cannot open ", path, ": ", std::strerror(errno));
  struct stat info {};
  if (::fstat(fd, &info) != 0 || S_ISDIR(info.st_mode)) {
    const int err = errno;
    ::close(fd);
    KOLO_THROW(FileError, "cannot read ", path, ": ", S_ISDIR(info.st_mode) ? "it is a directory" : std::strerror(err));
  }
  std::shared_ptr<MappedFile> file(new MappedFile());
  file->path_ = path;
  file->size_ = static_cast<size_t>(info.st_size);
  if (file->size_ > 0) {
    void* at = ::mmap(nullptr, file->size_, PROT_READ, MAP_SHARED, fd, 0);
    if (at == MAP_FAILED) {
      const int err = errno;
      ::close(fd);
      KOLO_THROW(FileError, "cannot map ", path, ": ", std::strerror(err));
    }
    file->data_ = static_cast<const uint8_t*>(at);
  }
  ::close(fd);  // the mapping keeps the file
  return file;
}

MappedFile::~MappedFile() {
  if (data_ != nullptr) ::munmap(const_cast<uint8_t*>(data_), size_);
}

}  // namespace kolo::data::detail
