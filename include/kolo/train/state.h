// The distributed checkpoint of the train layer, in the manner of torch.distributed.checkpoint:
// objects that hold training state say so (Stateful), and one collective save() / load()
// writes and restores a set of them through checkpoint::CheckpointManager's format (one
// directory per step: model.safetensors, optimizer.safetensors, extra.safetensors, meta.json).
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "kolo/comm/communicator.h"
#include "kolo/data.h"
#include "kolo/optim.h"
#include "kolo/safetensors.h"

namespace kolo::train {

using NamedTensors = checkpoint::NamedTensors;

/// One object's state, in the sections of a checkpoint. Objects saved together must use
/// distinct names in `tensors` and `metadata`, and at most one of them may fill `weights`
/// and `optimizer` (save() throws InvalidArgument otherwise).
struct StateDict {
  /// A model's tensors by state-dict name, whole (model.safetensors; what `kolo train --init`
  /// and the pipeline's stages read).
  NamedTensors weights{};
  /// The optimizer's kind ("sgd", "adam", "adamw"; empty: no optimizer state) and its state
  /// over the parameters of `weights` (optimizer.safetensors and the manifest's scalars).
  std::string optimizerKind{};
  optim::StateDict optimizer{};
  /// Further tensors (extra.safetensors): a communication hook's per-rank state, ...
  NamedTensors tensors{};
  /// Strings (the manifest's "extra"): what a resumed run checks or reports.
  std::map<std::string, std::string> metadata{};
};

/// Something whose state a checkpoint holds (an engine: weights, optimizer state, hook
/// state). Both calls are collective over the object's ranks: every rank calls them, in the
/// same order as the other ranks.
class Stateful {
 public:
  virtual ~Stateful() = default;
  /// The object's whole state on the rank that writes checkpoints (rank 0); other ranks take
  /// part in gathering it and may return an empty or partial state, which is not written.
  /// Blocking; collective.
  virtual StateDict stateDict() = 0;
  /// Restores a state saved by stateDict(): `state` holds the checkpoint's contents on rank
  /// 0 and is empty on the other ranks, which receive their part from rank 0. Blocking;
  /// collective. Throws Mismatch (on every rank alike) when the state does not fit the
  /// object (other tensor names or shapes, another optimizer kind, another rank count).
  virtual void loadStateDict(const StateDict& state) = 0;
};

/// Where a run stands: saved with every checkpoint, returned by load().
struct Position {
  /// Optimizer steps taken (the resumed run's next step).
  int64_t step = 0;
  /// The data loader's next batch (DataLoader::state()).
  data::LoaderState loader{};
  /// load(): the checkpoint directory it read, on rank 0 ("" elsewhere); ignored by save().
  std::string path{};
};

/// Where and how checkpoints are kept.
struct CheckpointOptions {
  /// Directory of the checkpoints (DIR/ckpt-<step>/); required.
  std::string directory{};
  /// Checkpoints kept; older ones are deleted after each save (>= 1).
  int keep = 3;
  /// The job's communicator (null: one process). Rank 0 writes; every rank calls.
  std::shared_ptr<comm::Communicator> communicator{};
  /// Strings that fix the run's identity (model, batch, seed, ...): written with every
  /// checkpoint, and load() refuses a checkpoint whose value of one of these keys differs.
  std::map<std::string, std::string> identity{};
  /// Receives warning lines (a checkpoint skipped on load and why); default: stderr.
  std::function<void(const std::string&)> warn{};
};

/// Saves the checkpoint of `position.step`: every object's stateDict() (collective, in the
/// order given), merged, and `options.identity`, written by rank 0 atomically (a crash
/// leaves the whole checkpoint or none). Returns the checkpoint's directory on rank 0, ""
/// elsewhere. Blocking; collective over options.communicator. Throws InvalidArgument when
/// two objects fill the same section or name, IoError naming the path when writing fails.
std::string save(const std::vector<Stateful*>& objects, const Position& position,
                 const CheckpointOptions& options);

/// Restores the newest good checkpoint under options.directory into `objects` (in the order
/// given) and returns its position; rank 0 reads it (skipping corrupt or truncated ones with
/// a warning) and every rank learns whether it could before any state moves. Blocking;
/// collective. Throws FileError when there is no good checkpoint there, Mismatch when its
/// identity differs from options.identity (naming the key and both values), and what the
/// objects' loadStateDict() throws; every rank throws (the others a PeerError naming rank
/// 0) rather than waiting.
Position load(const std::vector<Stateful*>& objects, const CheckpointOptions& options);

/// The directory a run resumes from: `resumeDir` when given; otherwise, in a Slurm job that
/// was requeued (SLURM_RESTART_COUNT above 0: `scontrol requeue`, or a node failure under
/// `sbatch --requeue`, which runs the job script again), `checkpointDir` when it holds a good
/// checkpoint, so that the job's next life continues where the last one stopped; else ""
/// (start fresh). Every rank sees the same directory before anything writes to it, so all
/// decide alike.
std::string resumeDirectory(const std::string& resumeDir, const std::string& checkpointDir);

}  // namespace kolo::train
