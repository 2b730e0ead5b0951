// Training checkpoints: weights and optimizer state as safetensors, plus step, epoch,
// data-loader position and RNG state in a JSON manifest carrying a CRC32 of every file.
// Written atomically (temporary directory, fsync, rename), the last K kept, and resume
// picks the newest checkpoint that verifies, skipping truncated or corrupt ones by name.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "kolo/data.h"
#include "kolo/optim.h"
#include "kolo/safetensors.h"
#include "kolo/tensor.h"

namespace kolo::checkpoint {

/// Everything a resumed run needs besides weights and optimizer state.
struct TrainingState {
  /// Optimizer steps taken so far (the resumed run starts with step `step`).
  int64_t step = 0;
  int64_t epoch = 0;
  /// Position of the data loader (its next batch).
  data::LoaderState loader;
  /// A kolo::Generator state (dropout and other randomness); empty if none.
  std::vector<uint64_t> rng;
  /// Free-form strings the caller wants back (model name, seed, strategy...).
  std::map<std::string, std::string> extra;
  /// Further named tensors the caller wants back (a communication hook's per-rank state),
  /// saved in extra.safetensors when not empty.
  NamedTensors tensors;
};

/// One checkpoint directory found under the manager's root.
struct CheckpointInfo {
  std::string path;
  int64_t step = 0;
};

/// A checkpoint's contents as stored: for callers that hold parts of the model (pipeline
/// stages, tensor-parallel shards) and cut their own from the whole tensors.
struct CheckpointContents {
  NamedTensors weights;
  /// The optimizer state's kind ("sgd", "adam", "adamw"; empty when none was saved) and its
  /// tensors under "<parameter>/<slot>" names (optim::StateDict::fromFlat) and scalars.
  std::string optimizerKind;
  NamedTensors optimizerTensors;
  std::map<std::string, double> optimizerScalars;
  TrainingState state;
};

/// Receives one warning line (a checkpoint that was skipped and why).
using WarningSink = std::function<void(const std::string&)>;

/// Manages the checkpoints under one directory: DIR/ckpt-<step, 9 digits>/ holding
/// model.safetensors, optimizer.safetensors, extra.safetensors (TrainingState::tensors, if
/// any) and meta.json.
class CheckpointManager {
 public:
  /// `keepLast` >= 1 checkpoints are kept (older ones are deleted after each save).
  /// `writer` false (every rank but 0) makes save() a no-op, so one rank writes. Warnings
  /// go to `warn` (default: a "kolo: warning: ..." line on stderr).
  explicit CheckpointManager(std::string dir, int keepLast = 3, bool writer = true,
                             WarningSink warn = nullptr);

  /// Writes the checkpoint of state.step: `weights` (a module's namedParameters()),
  /// `optimizer`'s stateDict() (may be null) and `state`. Atomic: a crash leaves either the
  /// complete checkpoint or none. Returns its directory ("" when not the writer). Throws
  /// IoError naming the path when writing fails.
  std::string save(const NamedTensors& weights, const optim::Optimizer* optimizer,
                   const TrainingState& state);

  /// The same from a checkpoint's contents as read() returns them (the optimizer state
  /// already flat; none when contents.optimizerKind is empty): for callers that assemble
  /// the state from several objects (train::save).
  std::string save(const CheckpointContents& contents);

  /// Checkpoint directories under the root, oldest first (not verified).
  std::vector<CheckpointInfo> list() const;
  /// The newest checkpoint that passes verify(); every newer one that fails is reported to
  /// the warning sink with its path and the problem. nullopt when none is good.
  std::optional<CheckpointInfo> latestGood() const;
  /// latestGood() then load(); nullopt (nothing changed) when there is none.
  std::optional<TrainingState> restoreLatest(const NamedTensors& weights,
                                             optim::Optimizer* optimizer) const;

  /// Checks a checkpoint directory: the manifest parses and its own checksum matches, and
  /// every file it lists has the recorded size and CRC32. Throws FormatError naming the
  /// file and what is wrong (missing, truncated, corrupt), IoError when unreadable.
  static void verify(const std::string& path);
  /// Verifies, then copies the weights into `weights` (by name, strict) and the optimizer
  /// state into `optimizer` (if not null; its kind must match), and returns the rest.
  static TrainingState load(const std::string& path, const NamedTensors& weights,
                            optim::Optimizer* optimizer);
  /// Verifies, then reads every file of the checkpoint at `path` whole. Throws as verify().
  static CheckpointContents read(const std::string& path);

  const std::string& directory() const { return dir_; }

 private:
  void prune() const;
  std::string dir_;
  int keepLast_;
  bool writer_;
  WarningSink warn_;
};

/// CRC32 (zlib's polynomial) of a whole file; throws IoError naming it when unreadable.
uint32_t fileCrc32(const std::string& path);

}  // namespace kolo::checkpoint
