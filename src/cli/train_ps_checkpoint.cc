// Parameter-server checkpoints on disk (train_ps_checkpoint.h).
#include "cli/train_ps_checkpoint.h"

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <fstream>

#include "kolo/error.h"

namespace kolo::cli {

std::string checkpointDirectory(const std::string& root, int64_t epoch) {
  char name[32];
  std::snprintf(name, sizeof name, "epoch-%06lld", static_cast<long long>(epoch));
  return root + "/" + name;
}

std::vector<PsCheckpoint> completeCheckpoints(const std::string& root) {
  std::vector<PsCheckpoint> found;
  std::error_code error;
  for (const auto& entry : std::filesystem::directory_iterator(root, error)) {
    const std::string name = entry.path().filename().string();
    if (name.rfind("epoch-", 0) != 0) continue;
    std::ifstream in(entry.path() / "chief.json");
    if (!in) continue;
    PsCheckpoint checkpoint;
    try {
      checkpoint.chief = nlohmann::json::parse(in);
      checkpoint.epoch = checkpoint.chief.at("epoch").get<int64_t>();
    } catch (const std::exception& e) {
      KOLO_THROW(FormatError, (entry.path() / "chief.json").string(), ": ", e.what());
    }
    checkpoint.path = entry.path().string();
    found.push_back(std::move(checkpoint));
  }
  std::sort(found.begin(), found.end(),
            [](const PsCheckpoint& a, const PsCheckpoint& b) { return a.epoch < b.epoch; });
  return found;
}

nlohmann::json jobIdentity(const TrainConfig& config, int servers) {
  return {{"model", config.model},
          {"batch", config.batch},
          {"seed", config.seed},
          {"servers", servers},
          {"ps_shard_bytes", config.psShardBytes},
          {"ps_unit_batches", config.psUnitBatches},
          {"train_limit", config.trainLimit}};
}

void completeCheckpoint(const std::string& directory, const nlohmann::json& chief) {
  const std::string path = directory + "/chief.json";
  const std::string temporary = path + ".tmp";
  {
    std::ofstream out(temporary);
    out << chief.dump() << "\n";
    if (!out.flush()) KOLO_THROW(IoError, "cannot write ", temporary);
  }
  std::filesystem::rename(temporary, path);
}

void dropOldCheckpoints(const std::string& root, int64_t keep) {
  const std::vector<PsCheckpoint> complete = completeCheckpoints(root);
  for (size_t i = 0; i + static_cast<size_t>(keep) < complete.size(); ++i)
    std::filesystem::remove_all(complete[i].path);
}

}  // namespace kolo::cli
