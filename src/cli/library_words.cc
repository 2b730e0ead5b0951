// The library's option names and the `kolo` flags that set them (library_words.h).
#include "cli/library_words.h"

#include <cctype>
#include <utility>

namespace kolo::cli {
namespace {

// Library option -> flag. A name is replaced only whole (not followed by a letter, digit or
// underscore), so FitOptions::steps does not eat into a longer name.
constexpr std::pair<const char*, const char*> kFlags[] = {
    {"FitOptions::batch", "--batch"},
    {"FitOptions::accumulate", "--accumulate"},
    {"FitOptions::epochs", "--epochs"},
    {"FitOptions::steps", "--steps"},
    {"FitOptions::checkpointEvery", "--checkpoint-every"},
    {"FitOptions::keepCheckpoints", "--keep-checkpoints"},
    {"FitOptions::timingSkip", "--timing-skip"},
    {"FitOptions::metricsEvery", "--metrics-every"},
    {"FitOptions::dropLast", "--drop-last"},
    {"FitOptions::checkSyncEvery", "--check-sync"},
    {"FitOptions::resumeDir", "--resume"},
    {"RunOptions::batch", "--batch"},
    // The parsers of option text: the flag whose value each reads.
    {"parseMethod", "--algorithm"},
    {"parsePartition", "--partition"},
    {"dataPathKind", "--data"},
    {"parseMeshShape", "--mesh"},
    {"parseSplitPoints", "--split-at"},
    {"parseMode", "--ps-mode"},
    {"parseCompression", "--ps-compress"},
    {"parseCompressSpec", "--compress"},
    {"FitOptions::metricsPath", "--metrics"},
    {"RunOptions::epochs", "--epochs"},
    {"RunOptions::steps", "--steps"},
    {"RunOptions::checkpointEvery", "--checkpoint-every"},
    {"RunOptions::keepCheckpoints", "--keep-checkpoints"},
    {"RunOptions::metricsEvery", "--metrics-every"},
    {"RunOptions::resumeDir", "--resume"},
    {"ParameterServerOptions::batch", "--batch"},
    {"ParameterServerOptions::epochs", "--epochs"},
    {"ParameterServerOptions::steps", "--steps"},
    {"ParameterServerOptions::checkpointEvery", "--checkpoint-every"},
    {"ParameterServerOptions::keepCheckpoints", "--keep-checkpoints"},
    {"ParameterServerOptions::resumeDir", "--resume"},
    {"ParameterServerOptions::unitBatches", "--ps-unit-batches"},
    {"ParameterServerOptions::shardBytes", "--ps-shard-bytes"},
    {"ParameterServerOptions::lookahead", "--ps-lookahead"},
    {"ParameterServerOptions::heartbeat", "--ps-heartbeat-seconds"},
    {"ParameterServerOptions::overlap", "--ps-overlap"},
    {"ParameterServerOptions::mode", "--ps-mode"},
    {"ServerOptions::staleness", "--staleness"},
    {"DataParallelOptions::clipNorm", "--clip-norm"},
    {"DataParallelOptions::commHook", "--compress"},
    {"DataParallelOptions::balanceBatch", "--balance"},
    {"StrategyOptions::replicas", "--replicas"},
    {"PipelineOptions::microBatches", "--micro-batches"},
    {"ModelParallelOptions::microBatches", "--micro-batches"},
    {"TensorParallelOptions::sequenceParallel", "--sequence-parallel"},
    {"LanguageModelConfig::heads", "--heads"},
    {"LanguageModelConfig::dModel", "--d-model"},
    {"LanguageModelConfig::kvHeads", "--kv-heads"},
    {"MeshShape", "--mesh"},
    {"ElasticOptions::minRanks", "--min-ranks"},
    {"FederatedOptions::clients", "--clients"},
    {"FederatedOptions::clientsPerRound", "--clients-per-round"},
    {"FederatedOptions::rounds", "--rounds"},
    {"FederatedOptions::serverLr", "--server-lr"},
    {"FederatedOptions::saThreshold", "--sa-threshold"},
    {"FederatedOptions::secureAgg", "--secure-agg"},
    {"FederatedOptions::dpNoise", "--dp-noise"},
    {"FederatedOptions::dpClip", "--dp-clip"},
    {"FederatedOptions::dpDelta", "--dp-delta"},
    {"FederatedOptions::simulatedDropRate", "--debug-drop-rate"},
    {"LocalTrainingOptions::proxMu", "--prox-mu"},
    {"LocalTrainingOptions::localEpochs", "--local-epochs"},
    {"LocalTrainingOptions::localBatch", "--local-batch"},
    {"PartitionSpec::shards", "--partition shards:"},
    {"setTensorMemoryLimit", "--memory-limit"},
    {"TrainingDataSpec::path", "--data"},
    {"TrainingDataSpec::testPath", "--test-data"},
    {"TrainingDataSpec::labelsPath", "--labels"},
    {"TrainingDataSpec::testLabelsPath", "--test-labels"},
    {"TrainingDataSpec::imageSize", "--image-size"},
};

// What the library calls kolo's launcher (the program that starts a job's processes and sets
// their KOLO_* variables) -> the command that does it, longest first.
constexpr std::pair<const char*, const char*> kLauncherWords[] = {
    {"kolo's launcher of P servers and W workers", "kolo run --ps P --workers W"},
    {"kolo's launcher of an elastic job", "kolo run --elastic"},
    {"kolo's launcher of a job that tolerates failures", "kolo run -n N --tolerate-failures -- PROGRAM ..."},
    {"the store of kolo's launcher", "kolo run's store"},
    {"kolo's launcher", "kolo run"},
};

bool continuesName(const std::string& text, size_t at) {
  if (at >= text.size()) return false;
  const auto c = static_cast<unsigned char>(text[at]);
  return std::isalnum(c) != 0 || c == '_';
}

}  // namespace

std::string inFlagWords(const std::string& message) {
  std::string text = message;
  for (const auto& [words, command] : kLauncherWords) {
    const std::string from(words), to(command);
    for (size_t at = text.find(from); at != std::string::npos; at = text.find(from, at + to.size()))
      text.replace(at, from.size(), to);
  }
  for (const auto& [name, flag] : kFlags) {
    const std::string from(name), to(flag);
    for (size_t at = text.find(from); at != std::string::npos; at = text.find(from, at)) {
      if (continuesName(text, at + from.size()) || (at > 0 && continuesName(text, at - 1))) {
        at += from.size();
        continue;
      }
      text.replace(at, from.size(), to);
      at += to.size();
    }
  }
  return text;
}

}  // namespace kolo::cli
