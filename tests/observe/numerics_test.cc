// Numeric checks through the library API: module hooks, the AnomalyDetector naming the
// module of a real or injected NaN/infinity (one process, and agreed over thread ranks),
// and the weight-sync check naming the rank whose weights were changed by hand.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <thread>

#include "kolo/autograd.h"
#include "kolo/comm/native.h"
#include "kolo/comm/stores.h"
#include "kolo/nn/models.h"
#include "kolo/numerics.h"
#include "kolo/ops.h"

namespace {

using kolo::Tensor;
using kolo::observe::AnomalyDetector;
using kolo::observe::AnomalyPhase;

struct Batch {
  Tensor inputs, labels;
};

Batch makeBatch(int64_t n = 8) {
  kolo::Generator gen(3);
  std::vector<int64_t> labels;
  for (int64_t i = 0; i < n; ++i) labels.push_back(i % 10);
  return {Tensor::rand({n, 784}, gen), Tensor::fromVector({n}, labels)};
}

void step(kolo::nn::Module& model, const Batch& batch) {
  Tensor loss = kolo::crossEntropy(model(batch.inputs), batch.labels);
  model.zeroGrad();
  loss.backward();
}

// Runs fn(comm, rank) on n thread ranks of a native communicator over an in-memory store.
void onRanks(int n, const std::function<void(kolo::comm::Communicator&, int)>& fn) {
  auto store = kolo::comm::makeMemoryStore();
  std::vector<std::thread> threads;
  std::vector<std::exception_ptr> errors(static_cast<size_t>(n));
  for (int r = 0; r < n; ++r) {
    threads.emplace_back([&, r] {
      try {
        kolo::comm::NativeOptions options;
        options.timeout = std::chrono::seconds(30);
        auto comm = kolo::comm::createNativeCommunicator(store, r, n, options);
        fn(*comm, r);
      } catch (...) {
        errors[static_cast<size_t>(r)] = std::current_exception();
      }
    });
  }
  for (auto& t : threads) t.join();
  for (auto& e : errors)
    if (e) std::rethrow_exception(e);
}

TEST(ModuleHooks, ForwardAndOutputGradientHooksSeeEveryChildOfSequential) {
  kolo::Generator gen(1);
  auto model = kolo::nn::makeModel("mlp", gen);
  std::vector<std::string> forwardOrder, backwardOrder;
  std::vector<std::pair<kolo::nn::Module*, int>> ids;
  for (auto& [name, module] : model->namedModules()) {
    if (name.empty()) continue;
    ids.emplace_back(module, module->addForwardHook([&, name = name](kolo::nn::Module&, const Tensor& out) {
      EXPECT_EQ(out.size(0), 8);
      forwardOrder.push_back(name);
    }));
    ids.emplace_back(module, module->addOutputGradHook([&, name = name](kolo::nn::Module&, const Tensor& g) {
      EXPECT_EQ(g.size(0), 8);
      backwardOrder.push_back(name);
    }));
  }
  step(*model, makeBatch());
  EXPECT_EQ(forwardOrder, (std::vector<std::string>{"0", "1", "2", "3", "4"}));
  EXPECT_EQ(backwardOrder, (std::vector<std::string>{"4", "3", "2", "1", "0"}));
  for (auto& [module, id] : ids) {
    module->removeForwardHook(id);
    module->removeOutputGradHook(id);
  }
  forwardOrder.clear();
  step(*model, makeBatch());
  EXPECT_TRUE(forwardOrder.empty());
}

TEST(AnomalyDetector, NamesTheLinearLayerWhoseWeightHoldsAnInfinity) {
  kolo::Generator gen(1);
  auto model = kolo::nn::makeModel("mlp", gen);
  AnomalyDetector detector(*model);
  detector.beginStep(0);
  step(*model, makeBatch());
  EXPECT_FALSE(detector.found().has_value());
  EXPECT_NO_THROW(detector.throwIfFound());

  // An infinity in the middle layer's weights: its output is the first non-finite tensor,
  // though every later module's output is non-finite too.
  for (auto& [name, parameter] : model->namedParameters()) {
    if (name == "2.weight") parameter.data<float>()[5] = std::numeric_limits<float>::infinity();
  }
  detector.beginStep(1);
  step(*model, makeBatch());
  ASSERT_TRUE(detector.found().has_value());
  EXPECT_EQ(detector.found()->module, "2");
  EXPECT_EQ(detector.found()->moduleType, "Linear");
  EXPECT_EQ(detector.found()->phase, AnomalyPhase::ForwardOutput);
  EXPECT_EQ(detector.found()->step, 1);
  try {
    detector.throwIfFound();
    FAIL() << "no DivergedError";
  } catch (const kolo::DivergedError& e) {
    EXPECT_NE(std::string(e.what()).find("step 1: the forward output of module '2' (Linear)"),
              std::string::npos)
        << e.what();
  }
}

TEST(AnomalyDetector, InjectedNanInAGradientIsFoundAtTheModuleItEnters) {
  kolo::Generator gen(1);
  auto model = kolo::nn::makeModel("cnn", gen);
  AnomalyDetector detector(*model);
  detector.injectNan(3, "8", AnomalyPhase::OutputGradient);
  for (int64_t s = 0; s < 4; ++s) {
    detector.beginStep(s);
    step(*model, makeBatch(4));
    if (s < 3) {
      EXPECT_FALSE(detector.found().has_value()) << s;
    }
  }
  ASSERT_TRUE(detector.found().has_value());
  EXPECT_EQ(detector.found()->module, "8");
  EXPECT_EQ(detector.found()->phase, AnomalyPhase::OutputGradient);
  EXPECT_EQ(detector.found()->nanCount, 1);
  EXPECT_EQ(detector.found()->firstIndex, 0);
  EXPECT_THROW(detector.injectNan(0, "fc9", AnomalyPhase::ForwardOutput), kolo::InvalidArgument);
}

TEST(AnomalyDetector, ParameterGradientsAreCheckedForModelsCalledThroughForward) {
  kolo::Generator gen(1);
  auto model = kolo::nn::makeModel("mlp", gen);
  AnomalyDetector detector(*model);
  detector.beginStep(0);
  // forward() on a Linear directly: no module hook runs, the leaf hooks still do.
  auto& first = dynamic_cast<kolo::nn::Linear&>(model->at(0));
  Tensor x = makeBatch().inputs;
  x.data<float>()[3] = std::nanf("");
  Tensor loss = kolo::sum(first.forward(x));
  loss.backward();
  ASSERT_TRUE(detector.found().has_value());
  EXPECT_EQ(detector.found()->phase, AnomalyPhase::ParameterGradient);
  EXPECT_EQ(detector.found()->parameter, "0.weight");
  EXPECT_EQ(detector.found()->module, "0");
}

TEST(AnomalyDetector, EveryRankNamesTheRankThatFoundTheNan) {
  onRanks(3, [](kolo::comm::Communicator& comm, int rank) {
    kolo::Generator gen(1);
    auto model = kolo::nn::makeModel("mlp", gen);
    AnomalyDetector detector(*model, {.parameterGradients = true, .rank = rank});
    if (rank == 1) detector.injectNan(2, "3", AnomalyPhase::ForwardOutput);
    for (int64_t s = 0; s < 2; ++s) {
      detector.beginStep(s);
      step(*model, makeBatch());
      detector.agree(comm);
    }
    detector.beginStep(2);
    step(*model, makeBatch());
    try {
      detector.agree(comm);
      ADD_FAILURE() << "rank " << rank << ": no DivergedError";
    } catch (const kolo::DivergedError& e) {
      EXPECT_NE(std::string(e.what()).find(
                    "rank 1, step 2: the forward output of module '3' (ReLU) holds 1 NaN"),
                std::string::npos)
          << e.what();
    }
  });
}

TEST(TensorHash, DependsOnValuesShapeAndDtypeNotOnLayout) {
  kolo::Generator gen(2);
  Tensor a = Tensor::rand({5, 7}, gen);
  EXPECT_EQ(kolo::observe::tensorHash(a), kolo::observe::tensorHash(a.clone()));
  EXPECT_EQ(kolo::observe::tensorHash(a.t().contiguous().t()), kolo::observe::tensorHash(a));
  EXPECT_NE(kolo::observe::tensorHash(a.reshape({7, 5})), kolo::observe::tensorHash(a));
  EXPECT_NE(kolo::observe::tensorHash(a.to(kolo::DType::F64)), kolo::observe::tensorHash(a));
  Tensor b = a.clone();
  uint32_t bits;
  std::memcpy(&bits, b.data<float>() + 34, 4);
  bits ^= 1;  // the last element's lowest bit
  std::memcpy(b.data<float>() + 34, &bits, 4);
  EXPECT_NE(kolo::observe::tensorHash(b), kolo::observe::tensorHash(a));
}

TEST(WeightSync, NamesTheRankWhoseWeightsWereChangedByHandAndTheFirstTensor) {
  onRanks(4, [](kolo::comm::Communicator& comm, int rank) {
    kolo::Generator gen(1);
    auto model = kolo::nn::makeModel("mlp", gen);
    const auto state = model->stateDict();
    const kolo::observe::SyncReport same = kolo::observe::compareReplicas(comm, state, 10);
    EXPECT_TRUE(same.inSync()) << same.describe();
    EXPECT_NO_THROW(kolo::observe::checkReplicasInSync(comm, state, 10));

    if (rank == 2) {
      for (auto& [name, tensor] : model->namedParameters()) {
        if (name == "2.weight" || name == "4.bias") tensor.data<float>()[0] += 1e-6f;
      }
    }
    const kolo::observe::SyncReport report = kolo::observe::compareReplicas(comm, state, 20);
    EXPECT_EQ(report.divergedRanks, std::vector<int>{2});
    EXPECT_EQ(report.firstTensor, "2.weight");
    EXPECT_EQ(report.tensorsDiffering, 2);
    try {
      kolo::observe::checkReplicasInSync(comm, state, 20);
      ADD_FAILURE() << "no ReplicaMismatch";
    } catch (const kolo::ReplicaMismatch& e) {
      EXPECT_EQ(std::string(e.what()),
                "weights out of sync at step 20: rank 2 differs from ranks 0, 1 and 3 (the "
                "majority) in 2 of 6 tensors, the first '2.weight'");
    }
  });
}

TEST(WeightSync, TwoRanksThatDisagreeNameRankOneAgainstRankZero) {
  onRanks(2, [](kolo::comm::Communicator& comm, int rank) {
    kolo::Generator gen(1);
    auto model = kolo::nn::makeModel("mlp", gen);
    if (rank == 1) model->namedParameters()[0].second.data<float>()[7] = 0.5f;
    const auto report = kolo::observe::compareReplicas(comm, model->stateDict(), 3);
    EXPECT_EQ(report.divergedRanks, std::vector<int>{1});
    EXPECT_EQ(report.agreeingRanks, std::vector<int>{0});
    EXPECT_EQ(report.firstTensor, "0.weight");
  });
}

}  // namespace
