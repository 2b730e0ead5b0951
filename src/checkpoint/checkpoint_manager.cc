// CheckpointManager: atomic checkpoint directories (temporary name, fsync, rename, fsync of
// the parent), a JSON manifest with a CRC32 per file, pruning to the last K, and the
// newest-good search that resume uses.
#include <fcntl.h>
#include <unistd.h>
#include <zlib.h>

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "checkpoint/manifest.h"
#include "kolo/checkpoint.h"
#include "kolo/error.h"

namespace kolo::checkpoint {
namespace fs = std::filesystem;
using nlohmann::json;

namespace {

constexpr const char* kPrefix = "ckpt-";
constexpr const char* kManifest = "meta.json";
constexpr const char* kModelFile = "model.safetensors";
constexpr const char* kOptimizerFile = "optimizer.safetensors";
constexpr const char* kExtraFile = "extra.safetensors";

std::string stepDirName(int64_t step) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%s%09lld", kPrefix, static_cast<long long>(step));
  return buf;
}

void fsyncPath(const std::string& path, bool directory) {
  const int fd = ::open(path.c_str(), directory ? (O_RDONLY | O_DIRECTORY) : O_RDONLY);
  if (fd < 0) KOLO_THROW(IoError, "cannot open '", path, "' to fsync it: ", std::strerror(errno));
  const int rc = ::fsync(fd);
  const int err = errno;
  ::close(fd);
  if (rc != 0) KOLO_THROW(IoError, "fsync of '", path, "' failed: ", std::strerror(err));
}

void writeFileSynced(const std::string& path, const std::string& text) {
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  if (fd < 0) KOLO_THROW(IoError, "cannot create '", path, "': ", std::strerror(errno));
  size_t done = 0;
  while (done < text.size()) {
    const ssize_t n = ::write(fd, text.data() + done, text.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      const int err = errno;
      ::close(fd);
      KOLO_THROW(IoError, "writing '", path, "' failed: ", std::strerror(err));
    }
    done += static_cast<size_t>(n);
  }
  const int rc = ::fsync(fd);
  const int err = errno;
  ::close(fd);
  if (rc != 0) KOLO_THROW(IoError, "fsync of '", path, "' failed: ", std::strerror(err));
}

detail::Manifest readManifest(const std::string& dir) {
  const std::string path = (fs::path(dir) / kManifest).string();
  std::ifstream in(path, std::ios::binary);
  if (!in) KOLO_THROW(FormatError, "checkpoint '", dir, "': ", kManifest, " is missing");
  std::stringstream text;
  text << in.rdbuf();
  return detail::parseManifest(text.str(), dir, kModelFile);
}

/// Checks every file the manifest lists against its recorded size and CRC32.
void verifyFiles(const std::string& path, const detail::Manifest& manifest) {
  for (const auto& [file, facts] : manifest.files) {
    const fs::path p = fs::path(path) / file;
    std::error_code ec;
    if (!fs::exists(p, ec))
      KOLO_THROW(FormatError, "checkpoint '", path, "': ", file, " is missing");
    const uint64_t actual = fs::file_size(p, ec);
    if (actual != facts.bytes)
      KOLO_THROW(FormatError, "checkpoint '", path, "': ", file, " has ", actual,
                 " bytes, the manifest says ", facts.bytes,
                 actual < facts.bytes ? " (truncated)" : " (overwritten)");
    const uint32_t crc = fileCrc32(p.string());
    if (crc != facts.crc32)
      KOLO_THROW(FormatError, "checkpoint '", path, "': ", file,
                 " fails its CRC32 check (corrupt): ", crc, " != ", facts.crc32);
  }
}

}  // namespace

uint32_t fileCrc32(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) KOLO_THROW(IoError, "cannot read '", path, "'");
  uLong crc = ::crc32(0L, Z_NULL, 0);
  std::vector<char> buf(1 << 20);
  while (in) {
    in.read(buf.data(), static_cast<std::streamsize>(buf.size()));
    const std::streamsize n = in.gcount();
    if (n > 0) crc = ::crc32(crc, reinterpret_cast<const Bytef*>(buf.data()), static_cast<uInt>(n));
  }
  if (in.bad()) KOLO_THROW(IoError, "reading '", path, "' failed");
  return static_cast<uint32_t>(crc);
}

CheckpointManager::CheckpointManager(std::string dir, int keepLast, bool writer, WarningSink warn)
    : dir_(std::move(dir)), keepLast_(keepLast), writer_(writer), warn_(std::move(warn)) {
  KOLO_CHECK(!dir_.empty(), "checkpoint directory is empty");
  KOLO_CHECK_GE(keepLast_, 1, "(checkpoints to keep)");
  if (!warn_)
    warn_ = [](const std::string& line) { std::cerr << "kolo: warning: " << line << std::endl; };
}

std::string CheckpointManager::save(const NamedTensors& weights, const optim::Optimizer* optimizer,
                                    const TrainingState& state) {
  if (!writer_) return "";
  CheckpointContents contents;
  contents.weights = weights;
  contents.state = state;
  if (optimizer) {
    optim::StateDict sd = optimizer->stateDict();
    contents.optimizerKind = optimizer->kind();
    contents.optimizerTensors = sd.flatTensors();
    contents.optimizerScalars = std::move(sd.scalars);
  }
  return save(contents);
}

std::string CheckpointManager::save(const CheckpointContents& contents) {
  if (!writer_) return "";
  const TrainingState& state = contents.state;
  KOLO_CHECK_GE(state.step, int64_t{0}, "(checkpoint step)");
  std::error_code ec;
  fs::create_directories(dir_, ec);
  if (ec) KOLO_THROW(IoError, "cannot create checkpoint directory '", dir_, "': ", ec.message());

  const std::string name = stepDirName(state.step);
  const fs::path finalDir = fs::path(dir_) / name;
  const fs::path tmpDir = fs::path(dir_) / (".tmp-" + name + "-" + std::to_string(::getpid()));
  fs::remove_all(tmpDir, ec);
  fs::create_directory(tmpDir, ec);
  if (ec) KOLO_THROW(IoError, "cannot create '", tmpDir.string(), "': ", ec.message());

  json manifest;
  manifest["format"] = detail::kManifestFormat;
  manifest["step"] = state.step;
  manifest["epoch"] = state.epoch;
  manifest["loader"] = {{"epoch", state.loader.epoch}, {"batch", state.loader.batch}};
  manifest["rng"] = state.rng;
  manifest["extra"] = state.extra;

  std::vector<std::string> files;
  saveSafetensors((tmpDir / kModelFile).string(), contents.weights,
                  {{"step", std::to_string(state.step)}});
  files.push_back(kModelFile);
  if (!contents.optimizerKind.empty()) {
    saveSafetensors((tmpDir / kOptimizerFile).string(), contents.optimizerTensors,
                    {{"kind", contents.optimizerKind}});
    files.push_back(kOptimizerFile);
    json scalars = json::object();
    for (const auto& [k, v] : contents.optimizerScalars) scalars[k] = v;
    manifest["optimizer"] = {{"kind", contents.optimizerKind}, {"scalars", scalars}};
  }
  if (!state.tensors.empty()) {
    saveSafetensors((tmpDir / kExtraFile).string(), state.tensors);
    files.push_back(kExtraFile);
  }
  json fileList = json::object();
  for (const auto& f : files) {
    const std::string p = (tmpDir / f).string();
    fsyncPath(p, false);
    fileList[f] = {{"bytes", fs::file_size(p)}, {"crc32", fileCrc32(p)}};
  }
  manifest["files"] = fileList;
  manifest["manifest_crc32"] = detail::manifestCrc(manifest);
  writeFileSynced((tmpDir / kManifest).string(), manifest.dump(2) + "\n");
  fsyncPath(tmpDir.string(), true);

  // Re-saving a step replaces the old directory; rename() cannot replace a non-empty one.
  if (fs::exists(finalDir)) fs::remove_all(finalDir, ec);
  fs::rename(tmpDir, finalDir, ec);
  if (ec)
    KOLO_THROW(IoError, "cannot rename '", tmpDir.string(), "' to '", finalDir.string(),
               "': ", ec.message());
  fsyncPath(dir_, true);
  prune();
  return finalDir.string();
}

std::vector<CheckpointInfo> CheckpointManager::list() const {
  std::vector<CheckpointInfo> out;
  std::error_code ec;
  if (!fs::is_directory(dir_, ec)) return out;
  for (const auto& entry : fs::directory_iterator(dir_, ec)) {
    const std::string name = entry.path().filename().string();
    if (!entry.is_directory() || name.rfind(kPrefix, 0) != 0) continue;
    // Names that are not ckpt-<int64> (too many digits, say) are not checkpoints.
    const std::string digits = name.substr(std::strlen(kPrefix));
    int64_t step = 0;
    const auto [end, ec] = std::from_chars(digits.data(), digits.data() + digits.size(), step);
    if (digits.empty() || digits[0] == '-' || ec != std::errc() ||
        end != digits.data() + digits.size())
      continue;
    out.push_back({entry.path().string(), step});
  }
  std::sort(out.begin(), out.end(), [](const auto& a, const auto& b) { return a.step < b.step; });
  return out;
}

void CheckpointManager::prune() const {
  auto all = list();
  std::error_code ec;
  for (size_t i = 0; i + static_cast<size_t>(keepLast_) < all.size(); ++i)
    fs::remove_all(all[i].path, ec);
  // Temporary directories left by a crashed save are garbage.
  for (const auto& entry : fs::directory_iterator(dir_, ec)) {
    if (entry.path().filename().string().rfind(".tmp-", 0) == 0) fs::remove_all(entry.path(), ec);
  }
}

void CheckpointManager::verify(const std::string& path) { verifyFiles(path, readManifest(path)); }

TrainingState CheckpointManager::load(const std::string& path, const NamedTensors& weights,
                                      optim::Optimizer* optimizer) {
  const detail::Manifest manifest = readManifest(path);
  verifyFiles(path, manifest);
  TrainingState state = manifest.state;
  loadSafetensorsInto((fs::path(path) / kModelFile).string(), weights, true);
  if (manifest.files.count(kExtraFile))
    state.tensors = loadSafetensors((fs::path(path) / kExtraFile).string()).tensors;
  if (optimizer) {
    if (!manifest.optimizer)
      KOLO_THROW(InvalidArgument, "checkpoint '", path, "' holds no optimizer state, but a ",
                 optimizer->kind(), " optimizer was given to restore");
    const std::string& kind = manifest.optimizer->kind;
    if (kind != optimizer->kind())
      KOLO_THROW(InvalidArgument, "checkpoint '", path, "' holds ", kind,
                 " optimizer state, but the optimizer is ", optimizer->kind());
    std::map<std::string, double> scalars = manifest.optimizer->scalars;
    SafetensorsFile file = loadSafetensors((fs::path(path) / kOptimizerFile).string());
    optim::StateDict sd = optim::StateDict::fromFlat(file.tensors, std::move(scalars));
    // State slots are per-element companions of their parameter: give a slot saved flat
    // the parameter's shape, which loadStateDict checks.
    for (const auto& [name, param] : optimizer->parameters()) {
      auto it = sd.perParameter.find(name);
      if (it == sd.perParameter.end()) continue;
      for (auto& [slot, t] : it->second)
        if (t.shape() != param.shape() && t.numel() == param.numel()) t = t.reshape(param.shape());
    }
    optimizer->loadStateDict(sd);
  }
  return state;
}

CheckpointContents CheckpointManager::read(const std::string& path) {
  const detail::Manifest manifest = readManifest(path);
  verifyFiles(path, manifest);
  CheckpointContents contents;
  contents.state = manifest.state;
  contents.weights = loadSafetensors((fs::path(path) / kModelFile).string()).tensors;
  if (manifest.files.count(kExtraFile))
    contents.state.tensors = loadSafetensors((fs::path(path) / kExtraFile).string()).tensors;
  if (manifest.optimizer) {
    contents.optimizerKind = manifest.optimizer->kind;
    contents.optimizerScalars = manifest.optimizer->scalars;
    contents.optimizerTensors = loadSafetensors((fs::path(path) / kOptimizerFile).string()).tensors;
  }
  return contents;
}

std::optional<CheckpointInfo> CheckpointManager::latestGood() const {
  auto all = list();
  for (auto it = all.rbegin(); it != all.rend(); ++it) {
    try {
      verify(it->path);
      return *it;
    } catch (const Error& e) {
      warn_(kolo::detail::concat("skipping checkpoint '", it->path, "': ", e.what()));
    }
  }
  return std::nullopt;
}

std::optional<TrainingState> CheckpointManager::restoreLatest(const NamedTensors& weights,
                                                              optim::Optimizer* optimizer) const {
  auto good = latestGood();
  if (!good) return std::nullopt;
  return load(good->path, weights, optimizer);
}

}  // namespace kolo::checkpoint
