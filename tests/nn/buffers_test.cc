// Tests of registered buffers and the state dict: BatchNorm1d against its closed form
// (batch statistics, running estimates, eval mode), names and order as PyTorch's
// state_dict, and loadStateDict's checks.
#include <gtest/gtest.h>

#include <cmath>

#include "autograd/gradcheck.h"
#include "kolo/nn/nn.h"

namespace kolo {
namespace {

std::vector<std::string> keys(const std::vector<std::pair<std::string, Tensor>>& entries) {
  std::vector<std::string> out;
  for (const auto& [n, t] : entries) out.push_back(n);
  return out;
}

// Per-channel mean and biased variance of x (N, C, L) (L = 1 for (N, C)), in double.
void channelStats(const std::vector<double>& x, int64_t n, int64_t c, int64_t l,
                  std::vector<double>& mean, std::vector<double>& var) {
  mean.assign(c, 0.0);
  var.assign(c, 0.0);
  for (int64_t ch = 0; ch < c; ++ch) {
    for (int64_t i = 0; i < n; ++i)
      for (int64_t j = 0; j < l; ++j) mean[ch] += x[(i * c + ch) * l + j];
    mean[ch] /= static_cast<double>(n * l);
    for (int64_t i = 0; i < n; ++i)
      for (int64_t j = 0; j < l; ++j) {
        const double d = x[(i * c + ch) * l + j] - mean[ch];
        var[ch] += d * d;
      }
    var[ch] /= static_cast<double>(n * l);
  }
}

void checkBatchNorm(int64_t n, int64_t c, int64_t l) {
  SCOPED_TRACE("input (" + std::to_string(n) + ", " + std::to_string(c) + ", " + std::to_string(l) + ")");
  Generator gen(21);
  const double eps = 1e-5, momentum = 0.1;
  nn::BatchNorm1d bn(c, eps, momentum);
  bn.weight.copyFrom(Tensor::rand({c}, gen, 0.5, 1.5));
  bn.bias.copyFrom(Tensor::rand({c}, gen, -1.0, 1.0));
  const std::vector<double> w = bn.weight.toDoubleVector(), b = bn.bias.toDoubleVector();
  const Shape shape = l == 1 ? Shape{n, c} : Shape{n, c, l};

  std::vector<double> runMean(c, 0.0), runVar(c, 1.0);
  for (int step = 0; step < 2; ++step) {
    Tensor x = Tensor::randn(shape, gen, 2.0, 3.0);
    const std::vector<double> xs = x.toDoubleVector();
    std::vector<double> mean, var;
    channelStats(xs, n, c, l, mean, var);
    const std::vector<float> y = bn.forward(x).toFloatVector();
    for (int64_t i = 0; i < n; ++i)
      for (int64_t ch = 0; ch < c; ++ch)
        for (int64_t j = 0; j < l; ++j) {
          const int64_t k = (i * c + ch) * l + j;
          const double expected = (xs[k] - mean[ch]) / std::sqrt(var[ch] + eps) * w[ch] + b[ch];
          EXPECT_NEAR(y[k], expected, 1e-4) << "element " << k << " step " << step;
        }
    const double unbiased = static_cast<double>(n * l) / static_cast<double>(n * l - 1);
    for (int64_t ch = 0; ch < c; ++ch) {
      runMean[ch] = (1 - momentum) * runMean[ch] + momentum * mean[ch];
      runVar[ch] = (1 - momentum) * runVar[ch] + momentum * var[ch] * unbiased;
    }
  }
  const std::vector<double> gotMean = bn.runningMean.toDoubleVector();
  const std::vector<double> gotVar = bn.runningVar.toDoubleVector();
  for (int64_t ch = 0; ch < c; ++ch) {
    EXPECT_NEAR(gotMean[ch], runMean[ch], 1e-5) << "running_mean " << ch;
    EXPECT_NEAR(gotVar[ch], runVar[ch], 1e-5) << "running_var " << ch;
  }
  EXPECT_EQ(bn.numBatchesTracked.item(), 2.0);

  // Eval mode: the running estimates normalise, and nothing moves.
  bn.train(false);
  Tensor x = Tensor::randn(shape, gen);
  const std::vector<double> xs = x.toDoubleVector();
  const std::vector<float> y = bn.forward(x).toFloatVector();
  for (int64_t i = 0; i < n; ++i)
    for (int64_t ch = 0; ch < c; ++ch)
      for (int64_t j = 0; j < l; ++j) {
        const int64_t k = (i * c + ch) * l + j;
        const double expected = (xs[k] - runMean[ch]) / std::sqrt(runVar[ch] + eps) * w[ch] + b[ch];
        EXPECT_NEAR(y[k], expected, 1e-4) << "eval element " << k;
      }
  EXPECT_EQ(bn.runningMean.toDoubleVector(), gotMean);
  EXPECT_EQ(bn.numBatchesTracked.item(), 2.0);
}

TEST(BatchNorm1d, MatchesTheClosedFormOnTwoAndThreeDimensions) {
  checkBatchNorm(6, 3, 1);
  checkBatchNorm(4, 2, 5);
}

TEST(BatchNorm1d, RefusesBadInputs) {
  nn::BatchNorm1d bn(3);
  EXPECT_THROW(bn.forward(Tensor::zeros({4, 2})), InvalidArgument);
  EXPECT_THROW(bn.forward(Tensor::zeros({4})), InvalidArgument);
  EXPECT_THROW(bn.forward(Tensor::zeros({1, 3})), InvalidArgument);  // one value per channel
  bn.train(false);
  EXPECT_EQ(bn.forward(Tensor::zeros({1, 3})).shape(), (Shape{1, 3}));
}

TEST(BatchNorm1d, GradcheckInTrainingAndEval) {
  Generator gen(22);
  for (bool training : {true, false}) {
    nn::BatchNorm1d bn(3);
    bn.train(training);
    bn.castParameters(DType::F64);
    EXPECT_EQ(bn.runningMean.dtype(), DType::F64);
    EXPECT_EQ(bn.numBatchesTracked.dtype(), DType::I64);
    bn.weight.copyFrom(Tensor::rand({3}, gen, 0.5, 1.5));
    Tensor x = Tensor::randn({5, 3, 2}, gen).to(DType::F64).clone();
    x.setRequiresGrad(true);
    testing::gradcheck([&](const std::vector<Tensor>&) { return bn.forward(x); },
                       {x, bn.weight, bn.bias});
  }
}

TEST(Buffers, NamesAndOrderFollowPyTorchStateDict) {
  Generator gen(23);
  auto inner = std::make_shared<nn::Sequential>();
  inner->add(std::make_shared<nn::BatchNorm1d>(4));
  nn::Sequential model{std::make_shared<nn::Linear>(3, 4, gen), inner, std::make_shared<nn::ReLU>()};
  EXPECT_EQ(keys(model.namedParameters()),
            (std::vector<std::string>{"0.weight", "0.bias", "1.0.weight", "1.0.bias"}));
  EXPECT_EQ(keys(model.namedBuffers()),
            (std::vector<std::string>{"1.0.running_mean", "1.0.running_var", "1.0.num_batches_tracked"}));
  EXPECT_EQ(keys(model.stateDict()),
            (std::vector<std::string>{"0.weight", "0.bias", "1.0.weight", "1.0.bias", "1.0.running_mean",
                                      "1.0.running_var", "1.0.num_batches_tracked"}));
  EXPECT_EQ(model.parameterCount(), 3 * 4 + 4 + 4 + 4);
  for (const Tensor& b : model.buffers()) EXPECT_FALSE(b.requiresGrad());
  EXPECT_EQ(model.namedBuffers()[2].second.shape(), Shape{});

  // The handles are the live buffers: a forward in training mode moves them in place.
  Tensor runningMean = model.namedBuffers()[0].second;
  model.forward(Tensor::randn({5, 3}, gen));
  EXPECT_NE(runningMean.toFloatVector(), std::vector<float>(4, 0.0f));
  EXPECT_EQ(runningMean.toFloatVector(), inner->namedBuffers()[0].second.toFloatVector());
}

// A module registering a parameter and a buffer under the same name.
class Clashing : public nn::Module {
 public:
  explicit Clashing(bool bufferFirst) {
    if (bufferFirst) {
      registerBuffer("x", Tensor::zeros({1}));
      registerParameter("x", Tensor::zeros({1}));
    } else {
      registerParameter("x", Tensor::zeros({1}));
      registerBuffer("x", Tensor::zeros({1}));
    }
  }
  Tensor forward(const Tensor& x) override { return x; }
};

TEST(Buffers, NamesAreUniqueAcrossParametersAndBuffers) {
  EXPECT_THROW(Clashing(true), InvalidArgument);
  EXPECT_THROW(Clashing(false), InvalidArgument);
}

std::shared_ptr<nn::Sequential> smallNet(uint64_t seed) {
  Generator gen(seed);
  return std::make_shared<nn::Sequential>(std::initializer_list<std::shared_ptr<nn::Module>>{
      std::make_shared<nn::Linear>(3, 4, gen), std::make_shared<nn::BatchNorm1d>(4)});
}

TEST(StateDict, LoadCopiesParametersAndBuffers) {
  auto source = smallNet(1);
  Generator gen(2);
  source->forward(Tensor::randn({6, 3}, gen));  // moves the running statistics
  auto target = smallNet(3);
  target->loadStateDict(source->stateDict());
  const auto a = source->stateDict(), b = target->stateDict();
  ASSERT_EQ(a.size(), b.size());
  for (size_t i = 0; i < a.size(); ++i)
    EXPECT_EQ(a[i].second.toDoubleVector(), b[i].second.toDoubleVector()) << a[i].first;
  // Copies, not aliases: the target's tensors keep their own storage.
  EXPECT_FALSE(b[0].second.sameAs(a[0].second));
  Tensor x = Tensor::randn({2, 3}, gen);
  source->train(false);
  target->train(false);
  EXPECT_EQ(source->forward(x).toFloatVector(), target->forward(x).toFloatVector());
}

void expectLoadError(nn::Module& m, const std::vector<std::pair<std::string, Tensor>>& state,
                     const std::string& fragment) {
  try {
    m.loadStateDict(state, "weights.bin");
    ADD_FAILURE() << "no error, expected one with '" << fragment << "'";
  } catch (const InvalidArgument& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("cannot load weights.bin"), std::string::npos) << what;
    EXPECT_NE(what.find(fragment), std::string::npos) << what;
  }
}

TEST(StateDict, LoadNamesMissingUnexpectedAndMisShapedKeys) {
  auto net = smallNet(4);
  const std::vector<float> before = net->namedParameters()[0].second.toFloatVector();
  auto state = smallNet(5)->stateDict();

  auto missing = state;
  missing.erase(missing.begin() + 4);  // 1.running_mean
  expectLoadError(*net, missing, "1.running_mean: missing from the weights.bin");

  auto unexpected = state;
  unexpected.emplace_back("2.weight", Tensor::zeros({1}));
  expectLoadError(*net, unexpected, "2.weight: in the weights.bin but not in the module");

  auto misShaped = state;
  misShaped[1].second = Tensor::zeros({5});
  expectLoadError(*net, misShaped, "0.bias: state has [5], module expects [4]");

  // Nothing was copied by the failed loads.
  EXPECT_EQ(net->namedParameters()[0].second.toFloatVector(), before);
}

}  // namespace
}  // namespace kolo
