// The checkpoints of a parameter-server job (train_ps.cc): DIR/epoch-NNNNNN/ holding
// server-<i>.safetensors per server and chief.json, which the chief writes last, once every
// server's file is on disk: a directory without it is incomplete and ignored.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "cli/train_loop.h"

namespace kolo::cli {

/// One complete checkpoint: its epochs done, directory and chief.json.
struct PsCheckpoint {
  int64_t epoch = 0;
  std::string path;
  nlohmann::json chief;
};

/// ROOT/epoch-NNNNNN.
std::string checkpointDirectory(const std::string& root, int64_t epoch);

/// Complete checkpoints under `root`, oldest first. Throws FormatError naming a chief.json
/// that does not parse or has no epoch.
std::vector<PsCheckpoint> completeCheckpoints(const std::string& root);

/// What fixes the placement, the weights' shapes and the data order: a resume must agree.
nlohmann::json jobIdentity(const TrainConfig& config, int servers);

/// Writes `chief` as DIRECTORY/chief.json (through a temporary file renamed into place),
/// which marks the checkpoint complete.
void completeCheckpoint(const std::string& directory, const nlohmann::json& chief);

/// Removes the oldest complete checkpoints under `root` beyond the newest `keep`.
void dropOldCheckpoints(const std::string& root, int64_t keep);

}  // namespace kolo::cli
