// SIGTERM during fit with checkpoints: the step under way ends, its checkpoint is saved and
// the process ends by SIGTERM; a run resumed from that directory continues at the next step.
// The training runs in a forked child, which the test signals once it is past a few steps.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <memory>
#include <string>

#include "kolo/nn/layers.h"
#include "kolo/ops.h"
#include "kolo/train/fit.h"

namespace kolo::train {
namespace {

namespace fs = std::filesystem;

std::shared_ptr<data::TensorDataset> dataset() {
  Generator gen(1);
  Tensor inputs = Tensor::randn({256, 8}, gen);
  return std::make_shared<data::TensorDataset>(inputs, argmax(inputs.slice(1, 0, 3), 1));
}

std::unique_ptr<DataParallelEngine> engine() {
  auto model = [] {
    Generator gen(2);
    return std::make_shared<nn::Sequential>(std::initializer_list<std::shared_ptr<nn::Module>>{
        std::make_shared<nn::Linear>(8, 16, gen), std::make_shared<nn::ReLU>(),
        std::make_shared<nn::Linear>(16, 3, gen)});
  };
  auto sgd = [](const parallel::NamedTensors& parameters) {
    return std::make_unique<optim::Sgd>(parameters, optim::SgdOptions{.lr = 0.05});
  };
  return std::make_unique<DataParallelEngine>(model, sgd, DataParallelOptions{});
}

FitOptions options(const std::string& dir, int64_t steps, observe::Logger& logger) {
  FitOptions o;
  o.batch = 16;
  o.steps = steps;
  o.quiet = true;
  o.prefetch = 0;
  o.logger = &logger;
  o.checkpointDir = dir;
  return o;
}

TEST(TerminateTest, SigtermSavesTheStepUnderWayAndAResumeContinuesFromIt) {
  const std::string dir = (fs::temp_directory_path() / ("kolo_terminate_" + std::to_string(::getpid()))).string();
  fs::remove_all(dir);
  int ready[2];
  ASSERT_EQ(::pipe(ready), 0);
  const pid_t child = ::fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    ::close(ready[0]);
    observe::Logger logger(stderr, observe::LogLevel::Error);
    auto e = engine();
    FitCallbacks callbacks;
    callbacks.onStepEnd = [&](const StepEnd& end) {
      if (end.step == 5) (void)!::write(ready[1], "x", 1);  // the parent signals now
    };
    fit(*e, dataset(), nullptr, options(dir, 100000000, logger), callbacks);
    ::_exit(3);  // a fit that ran to its end was never stopped
  }
  ::close(ready[1]);
  char byte = 0;
  ASSERT_EQ(::read(ready[0], &byte, 1), 1);
  ::close(ready[0]);
  ASSERT_EQ(::kill(child, SIGTERM), 0);
  int status = 0;
  ASSERT_EQ(::waitpid(child, &status, 0), child);
  ASSERT_TRUE(WIFSIGNALED(status)) << "the child exited with " << WEXITSTATUS(status);
  EXPECT_EQ(WTERMSIG(status), SIGTERM);

  int64_t saved = -1;
  for (const auto& entry : fs::directory_iterator(dir))
    saved = std::max<int64_t>(saved, std::stoll(entry.path().filename().string().substr(5)));
  ASSERT_GT(saved, 5) << "no checkpoint after step 5 in " << dir;

  observe::Logger logger(stderr, observe::LogLevel::Error);
  auto e = engine();
  FitOptions resumed = options(dir, saved + 3, logger);
  resumed.resumeDir = dir;
  int64_t first = -1;
  FitCallbacks callbacks;
  callbacks.onStepBegin = [&](int64_t step) {
    if (first < 0) first = step;
  };
  const FitSummary summary = fit(*e, dataset(), nullptr, resumed, callbacks);
  EXPECT_EQ(first, saved);
  EXPECT_EQ(summary.steps, saved + 3);
  fs::remove_all(dir);
}

}  // namespace
}  // namespace kolo::train
