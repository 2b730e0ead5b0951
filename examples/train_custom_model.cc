// A user-defined model trained on Fashion-MNIST with kolo's public API only: a Module
// subclass, the DataLoader, AdamW with warm-up + cosine, a progress bar, metrics lines and
// weights saved as safetensors.  Usage: train_custom_model [STEPS] [DATA_DIR]
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
#include "kolo/safetensors.h"

namespace {

// Two hidden layers with GELU and dropout: 784 -> 256 -> 128 -> 10.
class TwoLayerNet : public kolo::nn::Module {
 public:
  explicit TwoLayerNet(kolo::Generator& gen) {
    hidden1_ = registerModule("hidden1", std::make_shared<kolo::nn::Linear>(784, 256, gen));
    hidden2_ = registerModule("hidden2", std::make_shared<kolo::nn::Linear>(256, 128, gen));
    out_ = registerModule("out", std::make_shared<kolo::nn::Linear>(128, 10, gen));
    activation_ = registerModule("activation", std::make_shared<kolo::nn::GELU>());
    dropout_ = registerModule("dropout", std::make_shared<kolo::nn::Dropout>(0.1, 42));
  }

  kolo::Tensor forward(const kolo::Tensor& x) override {                             // x: (B, 784)
    kolo::Tensor h = dropout_->forward(activation_->forward(hidden1_->forward(x)));  // (B, 256)
    h = activation_->forward(hidden2_->forward(h));                                  // (B, 128)
    return out_->forward(h);                                                         // (B, 10)
  }

 private:
  std::shared_ptr<kolo::nn::Linear> hidden1_, hidden2_, out_;
  std::shared_ptr<kolo::nn::GELU> activation_;
  std::shared_ptr<kolo::nn::Dropout> dropout_;
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

  auto train = std::make_shared<kolo::data::FashionMnist>(dataDir, true);
  kolo::data::FashionMnist test(dataDir, false);
  kolo::data::DataLoader loader(
      train, std::make_shared<kolo::data::ShuffleSampler>(train->size(), /*seed=*/1),
      {.batchSize = 128});

  kolo::Generator gen(1);
  TwoLayerNet model(gen);
  kolo::optim::Adam optimizer(model.namedParameters(),
                              {.lr = 2e-3, .weightDecay = 0.01, .decoupled = true});
  kolo::optim::WarmupLr schedule(std::make_unique<kolo::optim::CosineLr>(2e-3, steps - steps / 10),
                                 steps / 10);

  kolo::observe::MetricsWriter metrics("train_custom_model.jsonl");
  kolo::observe::ProgressBar bar("training", steps);
  kolo::data::Batch batch;
  double loss = 0.0;
  for (int64_t step = 0; step < steps; ++step) {
    if (!loader.next(batch)) loader.next(batch);  // an epoch ended: start the next one
    kolo::Tensor logits = model.forward(batch.inputs);
    kolo::Tensor lossTensor = kolo::crossEntropy(logits, batch.labels);
    optimizer.zeroGrad();
    lossTensor.backward();
    optimizer.setLr(schedule.lrAt(step));
    optimizer.step();
    loss = lossTensor.item();
    bar.update(step + 1, "loss " + std::to_string(loss));
    if ((step + 1) % 100 == 0)
      metrics.write({{"step", step + 1}, {"train_loss", loss}, {"lr", optimizer.lr()}});
  }
  const double testAccuracy = accuracy(model, test);
  bar.finish("test accuracy " + std::to_string(testAccuracy));
  metrics.write({{"step", steps}, {"train_loss", loss}, {"test_accuracy", testAccuracy}});
  kolo::checkpoint::saveSafetensors("train_custom_model.safetensors", model.namedParameters());
  std::printf("test accuracy %.4f after %lld steps; weights in train_custom_model.safetensors\n",
              testAccuracy, static_cast<long long>(steps));
  return 0;
} catch (const kolo::Error& e) {
  std::fprintf(stderr, "train_custom_model: %s\n", e.what());
  return 1;
}
