// The safetensors writer and reader. Header bytes come from untrusted files: every length
// and offset is checked against the file size before anything is allocated or copied.
#include "kolo/safetensors.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <fstream>
#include <nlohmann/json.hpp>
#include <set>

namespace kolo::checkpoint {
namespace {

// Header lengths beyond this are refused (the format's reference reader uses 100 MB).
constexpr uint64_t kMaxHeaderBytes = 100ull << 20;

const char* safetensorsDtype(DType dtype) {
  switch (dtype) {
    case DType::F32:
      return "F32";
    case DType::F64:
      return "F64";
    case DType::F16:
      return "F16";
    case DType::BF16:
      return "BF16";
    case DType::I32:
      return "I32";
    case DType::I64:
      return "I64";
    case DType::U8:
      return "U8";
  }
  return "?";
}

bool parseSafetensorsDtype(const std::string& name, DType& out) {
  static const std::pair<const char*, DType> kTable[] = {
      {"F32", DType::F32}, {"F64", DType::F64}, {"F16", DType::F16}, {"BF16", DType::BF16},
      {"I32", DType::I32}, {"I64", DType::I64}, {"U8", DType::U8}};
  for (const auto& [text, dtype] : kTable) {
    if (name == text) {
      out = dtype;
      return true;
    }
  }
  return false;
}

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
    header[name] = {{"dtype", safetensorsDtype(data.dtype())},
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
  if (fileSize < 8)
    KOLO_THROW(FormatError, path, ": truncated safetensors file (", fileSize,
               " bytes, no header length)");
  uint8_t lengthBytes[8];
  in.read(reinterpret_cast<char*>(lengthBytes), 8);
  uint64_t headerLength = 0;
  for (int i = 0; i < 8; ++i) headerLength |= uint64_t(lengthBytes[i]) << (8 * i);
  if (headerLength > kMaxHeaderBytes || headerLength > fileSize - 8) {
    KOLO_THROW(FormatError, path, ": bad safetensors header length ", headerLength, " (file has ",
               fileSize, " bytes)");
  }
  std::string json(headerLength, '\0');
  in.read(json.data(), static_cast<std::streamsize>(headerLength));
  if (!in) KOLO_THROW(IoError, "reading the header of ", path);
  nlohmann::json header;
  try {
    header = nlohmann::json::parse(json);
  } catch (const nlohmann::json::exception& e) {
    KOLO_THROW(FormatError, path, ": safetensors header is not valid JSON (", e.what(), ")");
  }
  if (!header.is_object())
    KOLO_THROW(FormatError, path, ": safetensors header is not a JSON object");
  const uint64_t dataBytes = fileSize - 8 - headerLength;

  struct Entry {
    std::string name;
    DType dtype;
    Shape shape;
    uint64_t begin, end;
  };
  std::vector<Entry> entries;
  SafetensorsFile file;
  for (const auto& [name, value] : header.items()) {
    if (name == "__metadata__") {
      if (!value.is_object()) KOLO_THROW(FormatError, path, ": __metadata__ is not an object");
      for (const auto& [key, text] : value.items()) {
        if (!text.is_string())
          KOLO_THROW(FormatError, path, ": __metadata__ value of ", key, " is not a string");
        file.metadata[key] = text.get<std::string>();
      }
      continue;
    }
    if (!value.is_object() || !value.contains("dtype") || !value.contains("shape") ||
        !value.contains("data_offsets")) {
      KOLO_THROW(FormatError, path, ": entry ", name, " lacks dtype, shape or data_offsets");
    }
    Entry entry;
    entry.name = name;
    const auto& dtype = value["dtype"];
    if (!dtype.is_string() || !parseSafetensorsDtype(dtype.get<std::string>(), entry.dtype)) {
      KOLO_THROW(FormatError, path, ": entry ", name, " has unsupported dtype ", dtype.dump());
    }
    const auto& shape = value["shape"];
    if (!shape.is_array())
      KOLO_THROW(FormatError, path, ": entry ", name, " has a shape that is not a list");
    uint64_t numel = 1;
    for (const auto& dim : shape) {
      if (!dim.is_number_unsigned())
        KOLO_THROW(FormatError, path, ": entry ", name, " has a bad dimension ", dim.dump());
      const uint64_t d = dim.get<uint64_t>();
      if (d > 0 && numel > dataBytes / d + 1)
        KOLO_THROW(FormatError, path, ": entry ", name, " shape is too large");
      numel *= d;
      entry.shape.push_back(static_cast<int64_t>(d));
    }
    const auto& offsets = value["data_offsets"];
    if (!offsets.is_array() || offsets.size() != 2 || !offsets[0].is_number_unsigned() ||
        !offsets[1].is_number_unsigned()) {
      KOLO_THROW(FormatError, path, ": entry ", name, " has bad data_offsets ", offsets.dump());
    }
    entry.begin = offsets[0].get<uint64_t>();
    entry.end = offsets[1].get<uint64_t>();
    if (entry.begin > entry.end || entry.end > dataBytes) {
      KOLO_THROW(FormatError, path, ": entry ", name, " data_offsets [", entry.begin, ", ",
                 entry.end, "] lie outside the ", dataBytes, " data bytes (file truncated?)");
    }
    if (entry.end - entry.begin != numel * dtypeSize(entry.dtype)) {
      KOLO_THROW(FormatError, path, ": entry ", name, " has ", entry.end - entry.begin,
                 " bytes but shape ", shapeString(entry.shape), " of ",
                 safetensorsDtype(entry.dtype), " needs ", numel * dtypeSize(entry.dtype));
    }
    entries.push_back(std::move(entry));
  }
  std::sort(entries.begin(), entries.end(),
            [](const Entry& a, const Entry& b) { return a.begin < b.begin; });
  // The data section must be covered exactly, without holes or overlaps.
  uint64_t expected = 0;
  for (const Entry& entry : entries) {
    if (entry.begin != expected) {
      KOLO_THROW(FormatError, path, ": entry ", entry.name, " starts at byte ", entry.begin,
                 ", expected ", expected, " (overlapping or non-contiguous data_offsets)");
    }
    expected = entry.end;
  }
  if (expected != dataBytes) {
    KOLO_THROW(FormatError, path, ": header describes ", expected,
               " data bytes but the file holds ", dataBytes);
  }
  for (const Entry& entry : entries) {
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
