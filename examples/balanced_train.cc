// Load balancing in a user's own loop (kolo/parallel/balancer.h): every rank reads the whole
// global batch and trains on its share of it; the shares follow each rank's measured speed
// (re-planned every 10 steps), and each rank's loss is weighted by its share so that the
// averaged gradient is the mean over the global batch, as on one device. The lines marked
// [balance] are what changes from examples/distributed_train.cc.
// Run it with (rank 0 made twice as slow, as a busier host would be):
//   kolo run -n 2 -- ./build/release/examples/balanced_train [STEPS] [SLOW_RANK] [DATA_DIR]
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>
#include <thread>

#include "kolo/data.h"
#include "kolo/nn/layers.h"
#include "kolo/ops.h"
#include "kolo/optim.h"
#include "kolo/parallel/balancer.h"  // [balance]
#include "kolo/parallel/distributed.h"
#include "kolo/threads.h"

namespace {

using Clock = std::chrono::steady_clock;

// 784 -> 256 -> 10 with ReLU.
struct Net : kolo::nn::Module {
  explicit Net(kolo::Generator& gen) {
    hidden = registerModule("hidden", std::make_shared<kolo::nn::Linear>(784, 256, gen));
    out = registerModule("out", std::make_shared<kolo::nn::Linear>(256, 10, gen));
  }
  kolo::Tensor forward(const kolo::Tensor& x) override {  // x: (B, 784)
    return out->forward(kolo::relu(hidden->forward(x)));  // (B, 10)
  }

  std::shared_ptr<kolo::nn::Linear> hidden, out;
};

}  // namespace

int main(int argc, char** argv) try {
  const int64_t steps = argc > 1 ? std::atoll(argv[1]) : 300;
  const int slowRank = argc > 2 ? std::atoi(argv[2]) : 0;
  const std::string dataDir = argc > 3 ? argv[3] : kolo::data::kFashionMnistDir;
  const int64_t globalBatch = 128;

  kolo::setNumThreads(1);
  auto comm = kolo::parallel::init();
  const bool primary = comm->rank() == 0;
  kolo::parallel::Balancer balancer(globalBatch, comm->rank(), comm->size());  // [balance]

  // [balance] every rank reads the whole global batch (the same order on every rank).
  auto train = std::make_shared<kolo::data::FashionMnist>(dataDir, true);
  auto sampler = std::make_shared<kolo::data::DistributedSampler>(
      train->size(), kolo::data::DistributedSamplerOptions{.globalBatch = globalBatch, .seed = 1});
  kolo::data::DataLoader loader(train, sampler, {.batchSize = globalBatch});

  kolo::Generator gen(1);
  Net model(gen);
  kolo::parallel::DistributedOptimizer optimizer(
      std::make_unique<kolo::optim::Sgd>(model.namedParameters(),
                                         kolo::optim::SgdOptions{.lr = 0.05, .momentum = 0.9}),
      comm, model);

  int64_t step = 0;
  double sleep = 0.0;  // the slow rank's extra time per step
  const auto start = Clock::now();
  while (step < steps) {
    for (kolo::data::Batch& batch : loader) {
      // [balance] this rank's rows of the global batch: (share, 784)
      const int64_t from = balancer.offset(), to = from + balancer.share();
      const kolo::Tensor inputs = batch.inputs.slice(0, from, to).contiguous();
      const kolo::Tensor labels = batch.labels.slice(0, from, to).contiguous();
      if (comm->rank() == slowRank) std::this_thread::sleep_for(std::chrono::duration<double>(sleep));
      const auto computeStart = Clock::now();
      optimizer.zeroGrad();
      kolo::Tensor loss = kolo::crossEntropy(model(inputs), labels) * balancer.lossWeight();  // [balance]
      optimizer.setLocalLoss(loss.item());
      loss.backward();
      const double compute = std::chrono::duration<double>(Clock::now() - computeStart).count();
      optimizer.step();  // waits for the other ranks: not part of this rank's busy time
      if (comm->rank() == slowRank) sleep = compute;  // twice as slow
      balancer.record(compute + (comm->rank() == slowRank ? sleep : 0.0));  // [balance]
      if (balancer.replanDue() && balancer.replan(*comm) && primary)        // [balance]
        std::printf("step %lld: shares %lld and %lld of %lld\n", static_cast<long long>(step),
                    static_cast<long long>(balancer.share(0)),
                    static_cast<long long>(balancer.share(balancer.ranks() - 1)),
                    static_cast<long long>(globalBatch));
      ++step;
      if (step == steps) break;
    }
  }
  if (primary)
    std::printf("%lld steps in %.1f s, loss %.4f\n", static_cast<long long>(steps),
                std::chrono::duration<double>(Clock::now() - start).count(), optimizer.globalLoss());
  return 0;
} catch (const kolo::Error& e) {
  std::fprintf(stderr, "balanced_train: %s\n", e.what());
  return 1;
}
