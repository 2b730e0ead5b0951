// A user-defined model trained on N ranks with the Horovod-style API of
// kolo/parallel/distributed.h, written as a libtorch C++ frontend program (a Net deriving
// nn::Module, a range-for over each DataLoader epoch, kolo::save). The lines marked
// [distributed] are all that changes from the single-process version (a DistributedSampler
// instead of a ShuffleSampler, the optimizer wrapped, rank 0 alone printing and saving).
// Run it with:
//   kolo run -n 2 -- ./build/release/examples/distributed_train [STEPS] [DATA_DIR]
// Started without `kolo run` it trains as a single rank.
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>

#include "kolo/autograd.h"
#include "kolo/data.h"
#include "kolo/nn/layers.h"
#include "kolo/ops.h"
#include "kolo/optim.h"
#include "kolo/parallel/distributed.h"  // [distributed]
#include "kolo/serialize.h"
#include "kolo/threads.h"

namespace {

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

double accuracy(kolo::nn::Module& model, const kolo::data::TensorDataset& test) {
  kolo::autograd::NoGradGuard noGrad;
  const std::vector<float> logits = model.forward(test.inputs()).toFloatVector();  // (N, 10)
  const std::vector<double> labels = test.labels().toDoubleVector();
  int64_t correct = 0;
  for (size_t i = 0; i < labels.size(); ++i) {
    size_t best = 0;
    for (size_t c = 1; c < 10; ++c) best = logits[i * 10 + c] > logits[i * 10 + best] ? c : best;
    correct += static_cast<double>(best) == labels[i];
  }
  return static_cast<double>(correct) / static_cast<double>(labels.size());
}

}  // namespace

int main(int argc, char** argv) try {
  const int64_t steps = argc > 1 ? std::atoll(argv[1]) : 900;
  const std::string dataDir = argc > 2 ? argv[2] : kolo::data::kFashionMnistDir;
  const int64_t globalBatch = 128;

  kolo::setNumThreads(1);  // one intra-op thread per rank: the ranks fill the cores
  auto comm = kolo::parallel::init();      // [distributed]
  const bool primary = comm->rank() == 0;  // [distributed]

  auto train = std::make_shared<kolo::data::FashionMnist>(dataDir, true);
  auto sampler = std::make_shared<kolo::data::DistributedSampler>(  // [distributed]
      train->size(),
      kolo::data::DistributedSamplerOptions{
          .globalBatch = globalBatch, .rank = comm->rank(), .worldSize = comm->size(), .seed = 1});
  kolo::data::DataLoader loader(train, sampler, {.batchSize = sampler->localBatch()});

  kolo::Generator gen(1);
  Net model(gen);
  kolo::parallel::DistributedOptimizer optimizer(  // [distributed]
      std::make_unique<kolo::optim::Sgd>(model.namedParameters(),
                                         kolo::optim::SgdOptions{.lr = 0.05, .momentum = 0.9}),
      comm, model);  // with the model: its buffers follow rank 0's (DDP's broadcast_buffers)

  int64_t step = 0;
  while (step < steps) {
    for (kolo::data::Batch& batch : loader) {  // one epoch
      optimizer.zeroGrad();
      kolo::Tensor loss = kolo::crossEntropy(model(batch.inputs), batch.labels);
      optimizer.setLocalLoss(loss.item());  // [distributed] (for the global mean loss)
      loss.backward();                      // bucket all-reduces start here, during backward
      optimizer.step();                     // waits for them, averages, updates
      ++step;
      if (primary && step % 100 == 0)
        std::printf("step %lld loss %.4f\n", static_cast<long long>(step), optimizer.globalLoss());
      if (step == steps) break;
    }
  }
  if (primary) {  // [distributed]
    kolo::data::FashionMnist test(dataDir, false);
    std::printf("test accuracy %.4f after %lld steps of %lld samples on %d rank(s)\n",
                accuracy(model, test), static_cast<long long>(steps),
                static_cast<long long>(globalBatch), comm->size());
    kolo::save(model, "distributed_train.safetensors");
  }
  return 0;
} catch (const kolo::Error& e) {
  std::fprintf(stderr, "distributed_train: %s\n", e.what());
  return 1;
}
