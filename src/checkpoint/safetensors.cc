// The safetensors writer and reader. Header bytes come from untrusted files: they are
// checked by safetensors_header.cc before anything is allocated or copied.
#include "kolo/safetensors.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <fstream>
#include <nlohmann/json.hpp>
#include <set>

#include "checkpoint/safetensors_header.h"

namespace kolo::checkpoint {
namespace {

void writeAll(int fd, const void* data, size_t size, const std::string& path) {
  const auto* p = static_cast<const uint8_t*>(data);
  while (size > 0) {
    const ssize_t written = ::write(fd, p, size);
    if (written < 0) {
      if (errno == EINTR) continue;
      KOLO_THROW(IoError, "writing ", path, ": ", std::strerror(errno));
    }
    p += written;
    size -= static_cast<size_t>(written);
  }
}

}  // namespace

Tensor SafetensorsFile::find(const std::string& name) const {
  for (const auto& [key, tensor] : tensors) {
    if (key == name) return tensor;
  }
  return Tensor();
}

void saveSafetensors(const std::string& path, const NamedTensors& tensors,
                     const std::map<std::string, std::string>& metadata) {
  nlohmann::ordered_json header = nlohmann::ordered_json::object();
  if (!metadata.empty()) {
    nlohmann::ordered_json meta = nlohmann::ordered_json::object();
    for (const auto& [key, value] : metadata) meta[key] = value;
    header["__metadata__"] = meta;
  }
  std::set<std::string> seen;
  std::vector<Tensor> packed;
  uint64_t offset = 0;
  for (const auto& [name, tensor] : tensors) {
    KOLO_CHECK(!name.empty() && name != "__metadata__", "safetensors tensor name '", name, "' for ",
               path);
    KOLO_CHECK(seen.insert(name).second, "duplicate tensor name ", name, " for ", path);
    KOLO_CHECK(tensor.defined(), "tensor ", name, " is undefined (writing ", path, ")");
    Tensor data = tensor.contiguous();
    const uint64_t bytes = data.nbytes();
    header[name] = {{"dtype", detail::safetensorsDtypeName(data.dtype())},
                    {"shape", data.shape()},
                    {"data_offsets", {offset, offset + bytes}}};
    offset += bytes;
    packed.push_back(data);
  }
  std::string json = header.dump();
  // Pad with spaces so the data starts 8-byte aligned, as the reference writer does.
  while ((json.size() + 8) % 8 != 0) json.push_back(' ');
  uint8_t lengthBytes[8];
  const uint64_t length = json.size();
  for (int i = 0; i < 8; ++i) lengthBytes[i] = static_cast<uint8_t>(length >> (8 * i));

  const std::string temp = path + ".tmp." + std::to_string(::getpid());
  const int fd = ::open(temp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) KOLO_THROW(IoError, "cannot create ", temp, ": ", std::strerror(errno));
  try {
    writeAll(fd, lengthBytes, 8, temp);
    writeAll(fd, json.data(), json.size(), temp);
    for (const Tensor& data : packed) writeAll(fd, data.rawData(), data.nbytes(), temp);
    if (::fsync(fd) != 0) KOLO_THROW(IoError, "fsync ", temp, ": ", std::strerror(errno));
  } catch (...) {
    ::close(fd);
    ::unlink(temp.c_str());
    throw;
  }
  if (::close(fd) != 0) {
    ::unlink(temp.c_str());
    KOLO_THROW(IoError, "closing ", temp, ": ", std::strerror(errno));
  }
  if (::rename(temp.c_str(), path.c_str()) != 0) {
    const int err = errno;
    ::unlink(temp.c_str());
    KOLO_THROW(IoError, "renaming ", temp, " to ", path, ": ", std::strerror(err));
  }
}

SafetensorsFile loadSafetensors(const std::string& path) {
  std::ifstream in(path, std::ios::binary | std::ios::ate);
  if (!in) KOLO_THROW(IoError, "cannot open safetensors file ", path, ": ", std::strerror(errno));
  const uint64_t fileSize = static_cast<uint64_t>(in.tellg());
  in.seekg(0);
  uint8_t lengthBytes[8] = {};
  if (fileSize >= 8) in.read(reinterpret_cast<char*>(lengthBytes), 8);
  const uint64_t headerLength = detail::parseSafetensorsHeaderLength(lengthBytes, fileSize, path);
  std::string json(headerLength, '\0');
  in.read(json.data(), static_cast<std::streamsize>(headerLength));
  if (!in) KOLO_THROW(IoError, "reading the header of ", path);
  const detail::SafetensorsLayout layout =
      detail::parseSafetensorsHeader(json, fileSize - 8 - headerLength, path);
  SafetensorsFile file;
  file.metadata = layout.metadata;
  for (const detail::SafetensorsEntry& entry : layout.entries) {
    Tensor tensor = Tensor::empty(entry.shape, entry.dtype);
    in.seekg(static_cast<std::streamoff>(8 + headerLength + entry.begin));
    in.read(static_cast<char*>(tensor.rawData()),
            static_cast<std::streamsize>(entry.end - entry.begin));
    if (!in) KOLO_THROW(IoError, "reading tensor ", entry.name, " from ", path);
    tensor.setName(entry.name);
    file.tensors.emplace_back(entry.name, tensor);
  }
  return file;
}

void copyIntoTensors(const SafetensorsFile& file, const NamedTensors& targets, bool strict,
                     const std::string& source) {
  std::vector<std::string> problems;
  std::vector<std::pair<Tensor, Tensor>> copies;
  std::set<std::string> wanted;
  for (const auto& [name, target] : targets) {
    wanted.insert(name);
    Tensor stored = file.find(name);
    if (!stored.defined()) {
      if (strict) problems.push_back(name + ": missing from the file");
      continue;
    }
    if (stored.shape() != target.shape()) {
      problems.push_back(name + ": file has " + shapeString(stored.shape()) + ", model expects " +
                         shapeString(target.shape()));
      continue;
    }
    copies.emplace_back(target, stored);
  }
  if (strict) {
    for (const auto& [name, stored] : file.tensors) {
      if (!wanted.count(name)) problems.push_back(name + ": in the file but not in the model");
    }
  }
  if (!problems.empty()) {
    std::string message = "cannot load " + source + ":";
    for (const std::string& problem : problems) message += "\n  " + problem;
    KOLO_THROW(InvalidArgument, message);
  }
  for (auto& [target, stored] : copies) {
    Tensor destination = target;
    destination.copyFrom(stored);
  }
}

void loadSafetensorsInto(const std::string& path, const NamedTensors& targets, bool strict) {
  copyIntoTensors(loadSafetensors(path), targets, strict, path);
}

}  // namespace kolo::checkpoint
