// `kolo train`: trains a built-in model (mlp, cnn, lm) on Fashion-MNIST (or a text file)
// with one of kolo's strategies: the flags (train_flags.cc) fill cli::TrainConfig, which the
// runners of train_loop.h map onto the library. `--workers N` launches the command on N local
// ranks.
#include <cstdio>
#include <CLI/CLI.hpp>

#include "cli/commands.h"
#include "cli/train_flags.h"
#include "cli/train_loop.h"
#include "kolo/byte_size.h"
#include "kolo/error.h"
#include "kolo/memory.h"
#include "kolo/parallel/elastic.h"
#include "kolo/precision.h"
#include "kolo/settings.h"
#include "kolo/train/fit.h"

namespace kolo::cli {
Command registerTrain(CLI::App& root) {
  auto flags = std::make_shared<TrainFlags>();
  CLI::App* app = root.add_subcommand("train", "train a built-in model on Fashion-MNIST");
  auto scopes = std::make_shared<const FlagScopes>(addTrainFlags(app, *flags));
  app->footer(flagScopesText(*scopes));

  Command command;
  command.app = app;
  command.warnsAtStart = [flags] { return flags->workers == 0; };  // --workers: its ranks warn
  command.run = [app, flags, scopes]() -> int {
    if (flags->workers > 0) return runWorkers(flags->workers);
    flags->finish(*app);
    TrainConfig* config = &flags->config;
    checkFlagScopes(*scopes, *config);
    if (config->statusFile.empty()) config->statusFile = settings::statusFile();
    if (!config->memoryLimit.empty()) setTensorMemoryLimit(static_cast<int64_t>(parseByteSize(config->memoryLimit)));
    observe::Logger logger(stderr);
    train::startTimeline(config->timelineDir);
    // Every strategy computes on this thread (or on replica threads that take its setting).
    const MatmulPrecisionGuard products(parseMatmulPrecision(config->precision));
    KOLO_REQUIRE(!config->detectAnomaly || config->model != "lm", "--detect-anomaly is not available with --model lm");
    KOLO_REQUIRE(config->model != "lm" || !parallel::ElasticContext::launchedElastic(),
                 "kolo run --elastic trains --model mlp or cnn, not lm");
    if (config->strategy == "parameter-server") return runParameterServerRole(*config, logger);
    if (config->strategy == "federated") return runFederated(*config, logger);
    return runTraining(*config, logger);
  };
  return command;
}

}  // namespace kolo::cli
