// Golden comparisons of the convolutional network layers and the built-in resnet with PyTorch
// (fixture and generator: tests/fixtures/make_golden_resnet.py): BatchNorm2d's output,
// gradients, running statistics and eval mode on an odd shape; average and adaptive pooling;
// the resnet from PyTorch's own initial state through its logits, every parameter gradient
// and three SGD steps, ending with every state entry, running statistics included. Then the
// finite-difference checks of the new ops in f64, synchronised batch norm over a group of two
// equal to one batch norm on both halves, and the resnet's names against PyTorch's keys.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <condition_variable>
#include <mutex>
#include <thread>

#include "autograd/gradcheck.h"
#include "kolo/nn/nn.h"
#include "kolo/optim.h"
#include "nn/golden_fixture.h"

namespace kolo {
namespace {

using golden::readFixture;
using golden::Record;
using golden::relativeDifference;
using golden::relativeError;
using golden::toTensor;

constexpr double kRelTol = 1e-4;

std::map<std::string, Record> fixture() {
  return readFixture(std::string(KOLO_SOURCE_DIR) + "/tests/fixtures/golden_resnet.bin");
}

Tensor input(const Record& r) { return toTensor(r, DType::F32).setRequiresGrad(true); }

TEST(GoldenResNet, BatchNorm2dMatchesPyTorchInTrainingAndEval) {
  const auto f = fixture();
  nn::BatchNorm2d bn(5);
  bn.weight.copyFrom(toTensor(f.at("bn/weight"), DType::F32));
  bn.bias.copyFrom(toTensor(f.at("bn/bias"), DType::F32));
  Tensor x = input(f.at("bn/x"));
  const Tensor r = toTensor(f.at("bn/r"), DType::F32);
  Tensor y = bn(x);
  sum(y * r).backward();
  EXPECT_LE(relativeError(y, f.at("bn/y")), kRelTol);
  EXPECT_LE(relativeError(x.grad(), f.at("bn/grad_x")), kRelTol);
  EXPECT_LE(relativeError(bn.weight.grad(), f.at("bn/grad_weight")), kRelTol);
  EXPECT_LE(relativeError(bn.bias.grad(), f.at("bn/grad_bias")), kRelTol);
  bn(toTensor(f.at("bn/x2"), DType::F32));
  EXPECT_LE(relativeError(bn.runningMean, f.at("bn/running_mean")), kRelTol);
  EXPECT_LE(relativeError(bn.runningVar, f.at("bn/running_var")), kRelTol);
  EXPECT_EQ(bn.numBatchesTracked.item(), f.at("bn/num_batches_tracked").values[0]);

  bn.train(false);
  Tensor x2 = input(f.at("bn/x2"));
  y = bn(x2);
  sum(y * r).backward();
  EXPECT_LE(relativeError(y, f.at("bn/eval_y")), kRelTol);
  EXPECT_LE(relativeError(x2.grad(), f.at("bn/eval_grad_x")), kRelTol);
  EXPECT_EQ(bn.numBatchesTracked.item(), 2.0) << "eval mode counts no batch";
}

TEST(GoldenResNet, AverageAndAdaptivePoolingMatchPyTorch) {
  const auto f = fixture();
  const std::vector<std::pair<std::string, std::shared_ptr<nn::Module>>> pools = {
      {"avg", std::make_shared<nn::AvgPool2d>(3, 2, 1)},
      {"adaptive", std::make_shared<nn::AdaptiveAvgPool2d>(3, 2)},
      {"global", std::make_shared<nn::AdaptiveAvgPool2d>(1)}};
  for (const auto& [name, pool] : pools) {
    Tensor x = input(f.at("pool/x"));
    Tensor y = (*pool)(x);
    sum(y * toTensor(f.at(name + "/r"), DType::F32)).backward();
    EXPECT_LE(relativeError(y, f.at(name + "/y")), kRelTol) << name;
    EXPECT_LE(relativeError(x.grad(), f.at(name + "/grad_x")), kRelTol) << name;
  }
}

TEST(GoldenResNet, ResNetTakesPyTorchsStepsFromItsInitialState) {
  const auto f = fixture();
  Generator gen(0);
  auto model = nn::makeModel("resnet", gen);
  std::vector<std::pair<std::string, Tensor>> init;
  for (const auto& [name, record] : f)
    if (name.rfind("init/", 0) == 0)
      init.emplace_back(name.substr(5), toTensor(record, DType::F32));  // loading converts to i64
  model->loadStateDict(init, "the fixture's initial state");
  const Tensor x = toTensor(f.at("input"), DType::F32), labels = toTensor(f.at("labels"), DType::I64);
  optim::Sgd sgd(model->namedParameters(), {.lr = 0.05, .momentum = 0.9});
  const Record& losses = f.at("losses");
  for (size_t step = 0; step < losses.values.size(); ++step) {
    sgd.zeroGrad();
    const Tensor out = model->forward(x);
    Tensor loss = crossEntropy(out, labels);
    loss.backward();
    EXPECT_NEAR(loss.item(), losses.values[step], kRelTol * losses.values[step]) << "step " << step;
    if (step == 0) {
      EXPECT_LE(relativeError(out, f.at("output")), kRelTol) << "logits";
      for (const auto& [name, p] : model->namedParameters())
        EXPECT_LE(relativeError(p.grad(), f.at("grad/" + name)), kRelTol) << "gradient of " << name;
    }
    sgd.step();
  }
  size_t compared = 0;
  for (const auto& [name, t] : model->stateDict()) {
    EXPECT_LE(relativeError(t, f.at("final/" + name)), kRelTol) << name << " after the steps";
    ++compared;
  }
  EXPECT_EQ(compared, 56u) << "PyTorch's state_dict has 56 entries: 9 batch norms x 5, 9 convolutions, fc's two";
}

TEST(ConvNetOps, GradcheckBatchNormAndPoolingInF64) {
  Generator gen(7);
  for (bool training : {true, false}) {
    nn::BatchNorm2d bn(3);
    bn.train(training);
    bn.castParameters(DType::F64);
    bn.weight.copyFrom(Tensor::rand({3}, gen, 0.5, 1.5));
    bn.runningVar.copyFrom(Tensor::rand({3}, gen, 0.5, 1.5));
    Tensor x = Tensor::randn({2, 3, 3, 5}, gen).to(DType::F64).clone().setRequiresGrad(true);
    testing::gradcheck([&](const std::vector<Tensor>&) { return bn.forward(x); }, {x, bn.weight, bn.bias});
  }
  Tensor x = Tensor::randn({2, 2, 7, 5}, gen).to(DType::F64).clone().setRequiresGrad(true);
  testing::gradcheck([&](const std::vector<Tensor>& in) { return avgPool2d(in[0], 3, 2, 1); }, {x});
  testing::gradcheck([&](const std::vector<Tensor>& in) { return adaptiveAvgPool2d(in[0], 3, 2); }, {x});
  testing::gradcheck([&](const std::vector<Tensor>& in) { return adaptiveAvgPool2d(in[0], 1, 1); }, {x});
}

// A group of two replicas as threads: the group sum adds both halves' values once both arrived.
class TwoReplicaSum {
 public:
  GroupSum member(int replica) {
    return [this, replica](std::vector<double>& values) {
      std::unique_lock<std::mutex> lock(mutex_);
      const uint64_t round = rounds_;
      parts_[replica] = values;
      if (++arrived_ == 2) {
        for (size_t i = 0; i < parts_[0].size(); ++i) sum_.push_back(parts_[0][i] + parts_[1][i]);
        arrived_ = 0;
        taken_ = 0;
        ++rounds_;
        ready_.notify_all();
      } else {
        ready_.wait(lock, [&] { return rounds_ != round; });
      }
      values = sum_;
      if (++taken_ == 2) sum_.clear();
    };
  }

 private:
  std::mutex mutex_;
  std::condition_variable ready_;
  std::vector<double> parts_[2], sum_;
  int arrived_ = 0, taken_ = 0;
  uint64_t rounds_ = 0;
};

TEST(ConvNetOps, SynchronisedBatchNormOfTwoHalvesIsOneBatchNormOfTheWhole) {
  Generator gen(8);
  const Tensor x = Tensor::randn({6, 4, 5, 3}, gen, 1.0, 2.0), r = Tensor::randn({6, 4, 5, 3}, gen);
  // One batch norm over the whole batch, loss sum(y * r) / 2 as two replicas' mean.
  nn::BatchNorm2d whole(4);
  Tensor xw = x.clone().setRequiresGrad(true);
  (sum(whole(xw) * r) * 0.5).backward();

  nn::BatchNorm2d halves[2]{nn::BatchNorm2d(4), nn::BatchNorm2d(4)};
  Tensor parts[2];
  TwoReplicaSum group;
  std::vector<std::thread> threads;
  for (int k = 0; k < 2; ++k) {
    halves[k].setGroupSum(group.member(k));
    parts[k] = x.slice(0, 3 * k, 3 * k + 3).contiguous().setRequiresGrad(true);
    threads.emplace_back([&, k] { sum(halves[k](parts[k]) * r.slice(0, 3 * k, 3 * k + 3).contiguous()).backward(); });
  }
  for (auto& t : threads) t.join();
  // Each replica's input gradient is its rows of the whole's, doubled (its loss is one of two
  // in the mean); the parameters' gradients, averaged over the replicas, are the whole's.
  const Tensor gx = cat({parts[0].grad(), parts[1].grad()}, 0) * 0.5;
  EXPECT_LT(relativeDifference(gx, xw.grad()), 1e-5);
  EXPECT_LT(relativeDifference((halves[0].weight.grad() + halves[1].weight.grad()) * 0.5, whole.weight.grad()),
            1e-5);
  EXPECT_LT(relativeDifference((halves[0].bias.grad() + halves[1].bias.grad()) * 0.5, whole.bias.grad()), 1e-5);
  for (int k = 0; k < 2; ++k) {
    EXPECT_LT(relativeDifference(halves[k].runningMean, whole.runningMean), 1e-6) << k;
    EXPECT_LT(relativeDifference(halves[k].runningVar, whole.runningVar), 1e-6) << k;
  }
}

TEST(ConvNetOps, ResNetNamesArePyTorchsStateDictKeys) {
  Generator gen(0);
  auto model = nn::makeModel("resnet", gen);
  const auto state = model->stateDict();
  EXPECT_EQ(state.front().first, "conv1.weight");
  EXPECT_EQ(state[5].first, "bn1.num_batches_tracked");
  EXPECT_EQ(state[18].first, "layer2.conv1.weight");
  EXPECT_EQ(state[30].first, "layer2.shortcut.0.weight");
  EXPECT_EQ(state.back().first, "fc.bias");
  EXPECT_EQ(model->parameterCount(), 77754);
  EXPECT_THROW((*model)(Tensor::zeros({1, 783})), InvalidArgument);
  EXPECT_THROW(nn::BatchNorm2d(3)(Tensor::zeros({2, 3, 4})), InvalidArgument);
  EXPECT_THROW(nn::BatchNorm2d(3)(Tensor::zeros({1, 3, 1, 1})), InvalidArgument);  // one value per channel
}

}  // namespace
}  // namespace kolo
