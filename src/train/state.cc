// train::save / train::load: the Stateful objects' states merged into one
// checkpoint::CheckpointContents, written by rank 0 through CheckpointManager; on load rank 0
// reads and checks the newest good checkpoint and every rank learns the verdict before any
// object's state moves.
#include "kolo/train/state.h"

#include <exception>
#include <filesystem>
#include <set>

#include "kolo/checkpoint.h"
#include "kolo/error.h"
#include "kolo/settings.h"
#include "train/resume.h"

namespace kolo::train {
namespace {

int rankOf(const CheckpointOptions& options) {
  return options.communicator ? options.communicator->rank() : 0;
}

// Appends `from` to `into`, refusing a name already there (two objects that claim it).
void addUnique(NamedTensors& into, const NamedTensors& from, std::set<std::string>& names,
               const char* section) {
  for (const auto& [name, tensor] : from) {
    KOLO_REQUIRE(names.insert(name).second, "train::save: two objects hold the ", section,
                 " tensor '", name, "'");
    into.emplace_back(name, tensor);
  }
}

}  // namespace

std::string save(const std::vector<Stateful*>& objects, const Position& position,
                 const CheckpointOptions& options) {
  KOLO_REQUIRE(!options.directory.empty(), "train::save: CheckpointOptions::directory is empty");
  // Every rank gathers (the objects' stateDict() calls are collective); rank 0 merges.
  std::vector<StateDict> states;
  states.reserve(objects.size());
  for (Stateful* object : objects) states.push_back(object->stateDict());
  if (rankOf(options) != 0) return "";
  checkpoint::CheckpointContents contents;
  contents.state.step = position.step;
  contents.state.epoch = position.loader.epoch;
  contents.state.loader = position.loader;
  contents.state.extra = options.identity;
  std::set<std::string> tensorNames;
  bool weightsTaken = false;
  for (StateDict& state : states) {
    if (!state.weights.empty() || !state.optimizerKind.empty()) {
      KOLO_REQUIRE(!weightsTaken, "train::save: two objects hold model weights or optimizer "
                   "state; a checkpoint holds one model");
      weightsTaken = true;
      contents.weights = std::move(state.weights);
      contents.optimizerKind = state.optimizerKind;
      if (!state.optimizerKind.empty()) {
        contents.optimizerTensors = state.optimizer.flatTensors();
        contents.optimizerScalars = state.optimizer.scalars;
      }
    }
    addUnique(contents.state.tensors, state.tensors, tensorNames, "extra");
    for (const auto& [key, value] : state.metadata) {
      KOLO_REQUIRE(contents.state.extra.emplace(key, value).second,
                   "train::save: the metadata key '", key, "' is held twice");
    }
  }
  checkpoint::CheckpointManager manager(options.directory, options.keep, true, options.warn);
  return manager.save(contents);
}

Position load(const std::vector<Stateful*>& objects, const CheckpointOptions& options) {
  return detail::loadFrom(objects, options, "CheckpointOptions::directory");
}

namespace detail {

Position loadFrom(const std::vector<Stateful*>& objects, const CheckpointOptions& options,
                  const char* option) {
  KOLO_REQUIRE(!options.directory.empty(), "train::load: ", option, " is empty");
  const int rank = rankOf(options);
  const auto& comm = options.communicator;
  // Rank 0 reads the checkpoint and tells every rank whether it could (so that none waits
  // for a rank 0 that failed) and where the run stands.
  int64_t position[4] = {0, 0, 0, 0};  // ok, step, loader epoch, loader batch
  std::exception_ptr problem;
  StateDict state;  // rank 0: the checkpoint's contents
  std::string path;
  if (rank == 0) {
    try {
      // A directory that is not there is told apart from one without a good checkpoint:
      // the first is a wrong path, the second a run that never saved or saved torn files.
      std::error_code error;
      if (!std::filesystem::is_directory(options.directory, error))
        KOLO_THROW(FileError, option, " ", options.directory, ": no such directory");
      checkpoint::CheckpointManager manager(options.directory, options.keep, false, options.warn);
      const std::optional<checkpoint::CheckpointInfo> found = manager.latestGood();
      if (!found)
        KOLO_THROW(FileError, option, " ", options.directory,
                   ": no good checkpoint there (none written, or each one incomplete or corrupt)");
      checkpoint::CheckpointContents contents = checkpoint::CheckpointManager::read(found->path);
      for (const auto& [key, value] : options.identity) {
        const auto it = contents.state.extra.find(key);
        if (it != contents.state.extra.end() && it->second != value)
          KOLO_THROW(Mismatch, option, " ", found->path, ": the checkpoint was written with ",
                     key, " ", it->second, ", this run has ", key, " ", value);
      }
      path = found->path;
      state.weights = std::move(contents.weights);
      state.optimizerKind = contents.optimizerKind;
      if (!state.optimizerKind.empty())
        state.optimizer = optim::StateDict::fromFlat(contents.optimizerTensors,
                                                     contents.optimizerScalars);
      state.tensors = std::move(contents.state.tensors);
      state.metadata = std::move(contents.state.extra);
      position[0] = 1;
      position[1] = contents.state.step;
      position[2] = contents.state.loader.epoch;
      position[3] = contents.state.loader.batch;
    } catch (const Error&) {
      problem = std::current_exception();
    }
  }
  if (comm && comm->size() > 1) comm->broadcast(position, 4, DType::I64, 0);
  if (position[0] == 0) {
    if (problem) std::rethrow_exception(problem);
    KOLO_THROW(PeerError, "rank ", rank, ": rank 0 could not resume from ", options.directory);
  }
  for (Stateful* object : objects) object->loadStateDict(state);
  return Position{.step = position[1], .loader = {position[2], position[3]}, .path = path};
}

std::map<std::string, std::string> identityOf(const RunOptions& options) {
  std::map<std::string, std::string> identity = options.identity;
  identity.emplace("batch", std::to_string(options.batch));
  identity.emplace("seed", std::to_string(options.seed));
  return identity;
}

}  // namespace detail

std::string resumeDirectory(const std::string& resumeDir, const std::string& checkpointDir) {
  if (!resumeDir.empty() || checkpointDir.empty()) return resumeDir;
  const settings::Environment environment = settings::Environment::process();
  const std::string* restarts = environment.find("SLURM_RESTART_COUNT");
  if (!restarts || restarts->empty() || *restarts == "0") return "";
  const checkpoint::CheckpointManager manager(checkpointDir, 1, false, [](const std::string&) {});
  return manager.latestGood() ? checkpointDir : "";
}

}  // namespace kolo::train
