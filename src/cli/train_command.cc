// `kolo train`: trains a built-in model (mlp, cnn) on Fashion-MNIST on one rank; the flags
// map onto cli::TrainConfig and the work is done by cli::Trainer (train_loop.h).
#include <cstdio>

#include "cli/commands.h"
#include "cli/train_loop.h"
#include "kolo/error.h"

namespace kolo::cli {

Command registerTrain(CLI::App& root) {
  auto config = std::make_shared<TrainConfig>();
  struct Raw {
    int64_t epochs = 0, warmup = 0;
    double lr = 0, momentum = 0, weightDecay = 0;
    std::string optimizer;
    bool noShuffle = false, bar = false, noBar = false;
  };
  auto raw = std::make_shared<Raw>();
  CLI::App* app = root.add_subcommand("train", "train a built-in model on Fashion-MNIST");
  app->add_option("--model", config->model, "model: mlp or cnn")
      ->check(CLI::IsMember({"mlp", "cnn"}))
      ->capture_default_str();
  auto* epochs = app->add_option("--epochs", raw->epochs, "epochs (default 10)");
  app->add_option("--steps", config->steps, "total optimizer steps; stops early (0: all epochs)");
  app->add_option("--batch", config->batch, "batch size")->capture_default_str();
  auto* optimizer =
      app->add_option("--optimizer", raw->optimizer, "sgd, adam or adamw (default sgd)")
          ->check(CLI::IsMember({"sgd", "adam", "adamw"}));
  auto* lr = app->add_option("--lr", raw->lr,
                             "learning rate (default recipe: 0.1 mlp / 0.05 cnn; --optimizer sgd: "
                             "0.05 / 0.02; adam: 1e-3)");
  auto* momentum = app->add_option("--momentum", raw->momentum, "SGD momentum (default 0.9)");
  app->add_flag("--nesterov", config->nesterov, "Nesterov momentum (sgd)");
  auto* weightDecay =
      app->add_option("--weight-decay", raw->weightDecay, "weight decay (default 0; adamw 0.01)");
  app->add_option(
         "--schedule", config->schedule,
         "lr schedule: auto (warm-up + cosine without --lr, constant with it), constant, cosine, "
         "warmup-cosine, step")
      ->capture_default_str();
  auto* warmup =
      app->add_option("--warmup-steps", raw->warmup, "warm-up steps (default half an epoch)");
  app->add_option("--clip-norm", config->clipNorm, "clip the gradient norm to this (0: off)");
  app->add_option("--seed", config->seed, "seed of initialisation and shuffling")
      ->capture_default_str();
  app->add_flag("--no-shuffle", raw->noShuffle,
                "train in file order: step s uses samples s*B ... (s+1)*B-1");
  app->add_option("--data", config->dataDir, "directory of the Fashion-MNIST *-ubyte.gz files")
      ->capture_default_str();
  app->add_option("--init", config->initPath, "start from these weights (safetensors)");
  app->add_option("--save", config->savePath, "write the final weights here (safetensors)");
  app->add_option("--metrics", config->metricsPath, "write metrics here (JSON lines)");
  app->add_option("--threads", config->threads, "OpenBLAS threads")->capture_default_str();
  app->add_option("--strategy", config->strategy, "distribution strategy (this build: one-device)")
      ->capture_default_str();
  app->add_flag("--progress", raw->bar, "always draw a progress bar");
  app->add_flag("--no-progress", raw->noBar, "plain progress lines even on a terminal");
  app->add_flag("--quiet", config->quiet, "no progress output");

  Command command;
  command.app = app;
  command.run = [config, raw, epochs, optimizer, lr, momentum, weightDecay, warmup]() -> int {
    if (epochs->count()) config->epochs = raw->epochs;
    if (optimizer->count()) config->optimizer = raw->optimizer;
    if (lr->count()) config->lr = raw->lr;
    if (momentum->count()) config->momentum = raw->momentum;
    if (weightDecay->count()) config->weightDecay = raw->weightDecay;
    if (warmup->count()) config->warmupSteps = raw->warmup;
    config->shuffle = !raw->noShuffle;
    config->progress = raw->bar ? 1 : (raw->noBar ? 0 : -1);
    observe::Logger logger(stderr);
    Trainer trainer(*config, logger);
    const TrainSummary summary = trainer.run();
    std::printf("test_accuracy %.4f train_loss %.4f steps %lld samples_per_s %.1f wall_s %.1f\n",
                summary.testAccuracy, summary.trainLoss, static_cast<long long>(summary.steps),
                summary.samplesPerSecond, summary.wallSeconds);
    return 0;
  };
  return command;
}

}  // namespace kolo::cli
