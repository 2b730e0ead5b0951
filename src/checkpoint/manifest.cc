// Parsing and checking of checkpoint manifests. The file may be truncated or corrupt:
// every field is checked for presence, type and range before it is converted, so a bad
// manifest is a FormatError and never a JSON library exception or an out-of-range cast.
#include "checkpoint/manifest.h"

#include <zlib.h>

#include <limits>

#include "checkpoint/bounded_json.h"
#include "kolo/error.h"

namespace kolo::checkpoint::detail {
namespace {

using nlohmann::json;

class ManifestReader {
 public:
  ManifestReader(const std::string& dir) : where_("checkpoint '" + dir + "': meta.json") {}

  [[noreturn]] void fail(const std::string& what) const { KOLO_THROW(FormatError, where_, " ", what); }

  const json& field(const json& object, const char* name, const char* context = "") const {
    if (!object.is_object() || !object.contains(name))
      fail(std::string("lacks a field: ") + context + name);
    return object[name];
  }

  int64_t integer(const json& value, const char* name) const {
    if (value.is_number_unsigned()) {
      if (value.get<uint64_t>() > uint64_t(std::numeric_limits<int64_t>::max()))
        fail(std::string("field ") + name + " is out of range");
      return static_cast<int64_t>(value.get<uint64_t>());
    }
    if (!value.is_number_integer()) fail(std::string("field ") + name + " is not an integer");
    return value.get<int64_t>();
  }

  uint64_t unsignedInteger(const json& value, const std::string& name, uint64_t max) const {
    if (!value.is_number_unsigned() || value.get<uint64_t>() > max)
      fail("field " + name + " is not an integer in [0, " + std::to_string(max) + "]");
    return value.get<uint64_t>();
  }

  std::string string(const json& value, const std::string& name) const {
    if (!value.is_string()) fail("field " + name + " is not a string");
    return value.get<std::string>();
  }

  const std::string& where() const { return where_; }

 private:
  std::string where_;
};

bool plainFileName(const std::string& name) {
  return !name.empty() && name != "." && name != ".." &&
         name.find_first_of(std::string("/\0", 2)) == std::string::npos;
}

}  // namespace

uint32_t manifestCrc(json manifest) {
  manifest.erase("manifest_crc32");
  const std::string text = manifest.dump();
  return static_cast<uint32_t>(
      ::crc32(0L, reinterpret_cast<const Bytef*>(text.data()), static_cast<uInt>(text.size())));
}

Manifest parseManifest(std::string_view text, const std::string& dir, const std::string& modelFile) {
  const ManifestReader r(dir);
  const json manifest = parseBoundedJson(text, r.where() + " (truncated or corrupt?)");
  if (!manifest.is_object() || !manifest.contains("format") || !manifest["format"].is_string() ||
      manifest["format"].get<std::string>() != kManifestFormat)
    r.fail(std::string("is not a ") + kManifestFormat + " manifest");
  if (!manifest.contains("manifest_crc32") || !manifest["manifest_crc32"].is_number_unsigned() ||
      manifest["manifest_crc32"].get<uint64_t>() != manifestCrc(manifest))
    r.fail("fails its checksum (corrupt)");

  Manifest out;
  TrainingState& state = out.state;
  state.step = r.integer(r.field(manifest, "step"), "step");
  if (state.step < 0) r.fail("field step is negative");
  state.epoch = r.integer(r.field(manifest, "epoch"), "epoch");
  const json& loader = r.field(manifest, "loader");
  state.loader.epoch = r.integer(r.field(loader, "epoch", "loader."), "loader.epoch");
  state.loader.batch = r.integer(r.field(loader, "batch", "loader."), "loader.batch");
  const json& rng = r.field(manifest, "rng");
  if (!rng.is_array()) r.fail("field rng is not a list");
  for (const json& word : rng)
    state.rng.push_back(r.unsignedInteger(word, "rng", std::numeric_limits<uint64_t>::max()));
  const json& extra = r.field(manifest, "extra");
  if (!extra.is_object()) r.fail("field extra is not an object");
  for (const auto& [key, value] : extra.items()) state.extra[key] = r.string(value, "extra." + key);

  const json& files = r.field(manifest, "files");
  if (!files.is_object()) r.fail("field files is not an object");
  for (const auto& [name, facts] : files.items()) {
    if (!plainFileName(name)) r.fail("lists a file '" + name + "' outside the checkpoint");
    ManifestFile file;
    file.bytes = r.unsignedInteger(r.field(facts, "bytes", "files.*."), "files." + name + ".bytes",
                                   std::numeric_limits<uint64_t>::max());
    file.crc32 = static_cast<uint32_t>(r.unsignedInteger(
        r.field(facts, "crc32", "files.*."), "files." + name + ".crc32", 0xffffffffu));
    out.files[name] = file;
  }
  if (!out.files.count(modelFile)) r.fail("lists no " + modelFile);

  if (manifest.contains("optimizer")) {
    const json& optimizer = manifest["optimizer"];
    ManifestOptimizer record;
    record.kind = r.string(r.field(optimizer, "kind", "optimizer."), "optimizer.kind");
    const json& scalars = r.field(optimizer, "scalars", "optimizer.");
    if (!scalars.is_object()) r.fail("field optimizer.scalars is not an object");
    for (const auto& [key, value] : scalars.items()) {
      if (!value.is_number()) r.fail("field optimizer.scalars." + key + " is not a number");
      record.scalars[key] = value.get<double>();
    }
    out.optimizer = std::move(record);
  }
  return out;
}

}  // namespace kolo::checkpoint::detail
