// A user-defined model trained on Fashion-MNIST with kolo's public API only, written as a
// libtorch C++ frontend program: a Net deriving nn::Module with registered submodules, a
// range-for over each DataLoader epoch, AdamW with warm-up + cosine, a progress bar, metrics
// lines, and the state dict saved with kolo::save and read back with kolo::load.
// Usage: train_custom_model [STEPS] [DATA_DIR]
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>

#include "kolo/autograd.h"
#include "kolo/data.h"
#include "kolo/nn/layers.h"
#include "kolo/observe.h"
#include "kolo/ops.h"
#include "kolo/optim.h"
#include "kolo/serialize.h"
#include "kolo/threads.h"

namespace {

// Two hidden layers with GELU, batch normalisation and dropout: 784 -> 256 -> 128 -> 10.
struct Net : kolo::nn::Module {
  explicit Net(kolo::Generator& gen) {
    fc1 = registerModule("fc1", std::make_shared<kolo::nn::Linear>(784, 256, gen));
    bn1 = registerModule("bn1", std::make_shared<kolo::nn::BatchNorm1d>(256));
    fc2 = registerModule("fc2", std::make_shared<kolo::nn::Linear>(256, 128, gen));
    fc3 = registerModule("fc3", std::make_shared<kolo::nn::Linear>(128, 10, gen));
    dropout = registerModule("dropout", std::make_shared<kolo::nn::Dropout>(0.1, 42));
  }

  kolo::Tensor forward(const kolo::Tensor& x) override {  // x: (B, 784)
    kolo::Tensor h = kolo::gelu(bn1->forward(fc1->forward(x)));  // (B, 256)
    h = kolo::gelu(fc2->forward(dropout->forward(h)));           // (B, 128)
    return fc3->forward(h);                                      // (B, 10)
  }

  std::shared_ptr<kolo::nn::Linear> fc1, fc2, fc3;
  std::shared_ptr<kolo::nn::BatchNorm1d> bn1;  // running mean and variance are buffers
  std::shared_ptr<kolo::nn::Dropout> dropout;
};

double accuracy(kolo::nn::Module& model, const kolo::data::TensorDataset& test) {
  kolo::autograd::NoGradGuard noGrad;
  model.train(false);
  const std::vector<float> logits = model.forward(test.inputs()).toFloatVector();  // (N, 10)
  const std::vector<double> labels = test.labels().toDoubleVector();
  int64_t correct = 0;
  for (size_t i = 0; i < labels.size(); ++i) {
    size_t best = 0;
    for (size_t c = 1; c < 10; ++c) best = logits[i * 10 + c] > logits[i * 10 + best] ? c : best;
    correct += static_cast<double>(best) == labels[i];
  }
  model.train(true);
  return static_cast<double>(correct) / static_cast<double>(labels.size());
}

}  // namespace

int main(int argc, char** argv) try {
  const int64_t steps = argc > 1 ? std::atoll(argv[1]) : 600;
  const std::string dataDir = argc > 2 ? argv[2] : kolo::data::kFashionMnistDir;

  kolo::setNumThreads(1);  // intra-op threads (torch::set_num_threads); more on an idle machine
  auto train = std::make_shared<kolo::data::FashionMnist>(dataDir, true);
  kolo::data::FashionMnist test(dataDir, false);
  kolo::data::DataLoader loader(
      train, std::make_shared<kolo::data::ShuffleSampler>(train->size(), /*seed=*/1),
      {.batchSize = 128});

  kolo::Generator gen(1);
  Net model(gen);
  kolo::optim::Adam optimizer(model.namedParameters(),
                              {.lr = 2e-3, .weightDecay = 0.01, .decoupled = true});
  kolo::optim::WarmupLr schedule(std::make_unique<kolo::optim::CosineLr>(2e-3, steps - steps / 10),
                                 steps / 10);

  kolo::observe::MetricsWriter metrics("train_custom_model.jsonl");
  kolo::observe::ProgressBar bar("training", steps);
  double loss = 0.0;
  int64_t step = 0;
  while (step < steps) {
    for (kolo::data::Batch& batch : loader) {  // one epoch
      kolo::Tensor lossTensor = kolo::crossEntropy(model(batch.inputs), batch.labels);
      optimizer.zeroGrad();
      lossTensor.backward();
      optimizer.setLr(schedule.lrAt(step));
      optimizer.step();
      loss = lossTensor.item();
      bar.update(++step, "loss " + std::to_string(loss));
      if (step % 100 == 0)
        metrics.write({{"step", step}, {"train_loss", loss}, {"lr", optimizer.lr()}});
      if (step == steps) break;
    }
  }
  const double testAccuracy = accuracy(model, test);
  bar.finish("test accuracy " + std::to_string(testAccuracy));
  metrics.write({{"step", steps}, {"train_loss", loss}, {"test_accuracy", testAccuracy}});

  // Parameters and buffers (bn1.running_mean, ...) under PyTorch's state_dict names.
  kolo::save(model, "train_custom_model.safetensors");
  Net restored(gen);
  kolo::load(restored, "train_custom_model.safetensors");
  std::printf("test accuracy %.4f after %lld steps (%.4f reloaded from "
              "train_custom_model.safetensors)\n",
              testAccuracy, static_cast<long long>(steps), accuracy(restored, test));
  return 0;
} catch (const kolo::Error& e) {
  std::fprintf(stderr, "train_custom_model: %s\n", e.what());
  return 1;
}
