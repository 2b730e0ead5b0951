// Optimizers against hand-computed single steps and against torch.optim (fixture made by
// make_fixtures.py), schedules in closed form, clipping, and state save/restore.
#include <gtest/gtest.h>

#include <cmath>
#include <fstream>
#include <functional>
#include <nlohmann/json.hpp>

#include "kolo/optim.h"

namespace kolo::optim {
namespace {

Tensor parameter(const std::vector<float>& values) {
  Tensor p = Tensor::fromVector({static_cast<int64_t>(values.size())}, values);
  p.setRequiresGrad(true);
  return p;
}

void setGrad(Tensor& p, const std::vector<float>& values) {
  p.setGrad(Tensor::fromVector({static_cast<int64_t>(values.size())}, values));
}

TEST(SgdTest, PlainStepIsLrTimesGradPlusDecay) {
  Tensor p = parameter({1.0f, -2.0f});
  Sgd sgd({{"w", p}}, SgdOptions{.lr = 0.5, .weightDecay = 0.1});
  setGrad(p, {0.2f, 0.4f});
  sgd.step();
  // p - lr * (g + wd * p)
  EXPECT_FLOAT_EQ(p.toFloatVector()[0], 1.0f - 0.5f * (0.2f + 0.1f * 1.0f));
  EXPECT_FLOAT_EQ(p.toFloatVector()[1], -2.0f - 0.5f * (0.4f - 0.1f * 2.0f));
}

TEST(SgdTest, MomentumFirstStepUsesGradThenAccumulates) {
  Tensor p = parameter({1.0f});
  Sgd sgd({{"w", p}}, SgdOptions{.lr = 0.1, .momentum = 0.9, .dampening = 0.5});
  setGrad(p, {1.0f});
  sgd.step();  // buf = 1 (no dampening on the first step), p = 1 - 0.1
  EXPECT_FLOAT_EQ(p.toFloatVector()[0], 0.9f);
  sgd.step();  // buf = 0.9 * 1 + 0.5 * 1 = 1.4, p = 0.9 - 0.14
  EXPECT_NEAR(p.toFloatVector()[0], 0.76f, 1e-6);
  EXPECT_EQ(sgd.stepCount(), 2);
}

TEST(SgdTest, NesterovLooksAhead) {
  Tensor p = parameter({0.0f});
  Sgd sgd({{"w", p}}, SgdOptions{.lr = 1.0, .momentum = 0.5, .nesterov = true});
  setGrad(p, {2.0f});
  sgd.step();  // buf = 2, d = 2 + 0.5 * 2 = 3
  EXPECT_FLOAT_EQ(p.toFloatVector()[0], -3.0f);
  sgd.step();  // buf = 0.5 * 2 + 2 = 3, d = 2 + 1.5 = 3.5
  EXPECT_FLOAT_EQ(p.toFloatVector()[0], -6.5f);
}

TEST(SgdTest, NesterovWithoutMomentumIsRefused) {
  Tensor p = parameter({0.0f});
  EXPECT_THROW(Sgd({{"w", p}}, SgdOptions{.lr = 1.0, .nesterov = true}), InvalidArgument);
}

TEST(OptimizerTest, ACallersWrongOptionsAreUsageErrorsNotFailedChecks) {
  Tensor p = parameter({0.0f});
  for (const auto& make : std::vector<std::function<void()>>{
           [&] { Sgd({{"w", p}}, SgdOptions{.lr = 0.1, .momentum = -1.0}); },
           [&] { Sgd({{"w", p}}, SgdOptions{.lr = -0.1}); },
           [&] { Adam({{"w", p}}, AdamOptions{.beta1 = 1.0}); },
           [&] { Sgd({{"w", p}, {"w", p}}, SgdOptions{.lr = 0.1}); },
           [] { CosineLr(0.1, 0); }}) {
    try {
      make();
      ADD_FAILURE() << "no error";
    } catch (const InternalError& e) {
      ADD_FAILURE() << "reported as an internal error: " << e.what();
    } catch (const InvalidArgument&) {
    }
  }
}

TEST(SgdTest, ParameterWithoutGradIsLeftAlone) {
  Tensor p = parameter({3.0f});
  Sgd sgd({{"w", p}}, SgdOptions{.lr = 1.0});
  sgd.step();
  EXPECT_FLOAT_EQ(p.toFloatVector()[0], 3.0f);
}

TEST(AdamTest, FirstStepMovesByLrTimesSignOfGrad) {
  // After one step m/(1-b1) = g and sqrt(v/(1-b2)) = |g|, so the step is lr*g/(|g|+eps).
  Tensor p = parameter({1.0f, 1.0f});
  Adam adam({{"w", p}}, AdamOptions{.lr = 0.1});
  setGrad(p, {0.5f, -4.0f});
  adam.step();
  EXPECT_NEAR(p.toFloatVector()[0], 1.0f - 0.1f * 0.5f / (0.5f + 1e-8f), 1e-6);
  EXPECT_NEAR(p.toFloatVector()[1], 1.1f, 1e-6);
}

TEST(AdamTest, AdamWShrinksWeightsBeforeTheUpdate) {
  Tensor p = parameter({2.0f});
  auto adamw = makeAdamW({{"w", p}}, AdamOptions{.lr = 0.1, .weightDecay = 0.5});
  setGrad(p, {1.0f});
  adamw->step();
  EXPECT_EQ(adamw->kind(), "adamw");
  EXPECT_NEAR(p.toFloatVector()[0], 2.0f * (1.0f - 0.05f) - 0.1f, 1e-6);
}

// ---- against torch.optim ----

TEST(OptimizerTorchTest, MatchesTorchOverSeveralSteps) {
  std::ifstream in(std::string(KOLO_SOURCE_DIR) + "/tests/optim/optim_fixtures.json");
  ASSERT_TRUE(in) << "missing tests/optim/optim_fixtures.json";
  const nlohmann::json fixture = nlohmann::json::parse(in);
  const std::vector<std::string> names = {"0.weight", "0.bias"};
  for (const auto& testCase : fixture["cases"]) {
    SCOPED_TRACE(testCase["name"].get<std::string>());
    NamedParameters params;
    for (const std::string& name : names) {
      Tensor p = Tensor::fromVector(fixture["shapes"][name].get<Shape>(),
                                    fixture["init"][name].get<std::vector<float>>());
      p.setRequiresGrad(true);
      params.emplace_back(name, p);
    }
    const auto& o = testCase["options"];
    std::unique_ptr<Optimizer> optimizer;
    const std::string kind = testCase["kind"];
    if (kind == "sgd") {
      optimizer =
          std::make_unique<Sgd>(params, SgdOptions{.lr = o.value("lr", 0.01),
                                                   .momentum = o.value("momentum", 0.0),
                                                   .dampening = o.value("dampening", 0.0),
                                                   .weightDecay = o.value("weight_decay", 0.0),
                                                   .nesterov = o.value("nesterov", false)});
    } else {
      AdamOptions options{.lr = o.value("lr", 1e-3),
                          .beta1 = o.value("beta1", 0.9),
                          .beta2 = o.value("beta2", 0.999),
                          .eps = o.value("eps", 1e-8),
                          .weightDecay = o.value("weight_decay", kind == "adamw" ? 0.01 : 0.0)};
      optimizer =
          kind == "adamw" ? makeAdamW(params, options) : std::make_unique<Adam>(params, options);
    }
    const auto& grads = fixture["grads"];
    for (size_t step = 0; step < grads.size(); ++step) {
      for (auto& [name, p] : params) {
        p.setGrad(Tensor::fromVector(p.shape(), grads[step][name].get<std::vector<float>>()));
      }
      optimizer->step();
      for (auto& [name, p] : params) {
        const std::vector<float> expected =
            testCase["expected"][step][name].get<std::vector<float>>();
        const std::vector<float> actual = p.toFloatVector();
        ASSERT_EQ(actual.size(), expected.size());
        for (size_t i = 0; i < actual.size(); ++i) {
          ASSERT_NEAR(actual[i], expected[i], 1e-5 * std::max(1.0f, std::fabs(expected[i])))
              << name << "[" << i << "] after step " << step + 1;
        }
      }
    }
  }
}

// ---- state ----

TEST(OptimizerStateTest, RestoredStateContinuesIdentically) {
  auto run = [](bool interrupt) {
    Tensor p = parameter({1.0f, 2.0f, 3.0f});
    auto adam = std::make_unique<Adam>(NamedParameters{{"w", p}}, AdamOptions{.lr = 0.05});
    for (int step = 0; step < 6; ++step) {
      if (interrupt && step == 3) {
        StateDict saved = adam->stateDict();
        Tensor copy = p.clone();
        copy.setRequiresGrad(true);
        p = copy;
        adam = std::make_unique<Adam>(NamedParameters{{"w", p}}, AdamOptions{.lr = 0.5});
        // Round trip through the flat form a checkpoint would use.
        adam->loadStateDict(StateDict::fromFlat(saved.flatTensors(), saved.scalars));
      }
      setGrad(p, {0.1f * step, -0.2f, 0.3f});
      adam->step();
    }
    EXPECT_DOUBLE_EQ(adam->lr(), 0.05);
    EXPECT_EQ(adam->stepCount(), 6);
    return p.toFloatVector();
  };
  EXPECT_EQ(run(false), run(true));
}

TEST(OptimizerStateTest, StateForUnknownParameterIsRefused) {
  Tensor p = parameter({1.0f});
  Sgd sgd({{"w", p}}, SgdOptions{.lr = 0.1, .momentum = 0.9});
  StateDict state;
  state.perParameter["other"]["momentum_buffer"] = Tensor::zeros({1});
  try {
    sgd.loadStateDict(state);
    FAIL() << "expected InvalidArgument";
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("other"), std::string::npos) << e.what();
  }
}

TEST(OptimizerTest, ZeroGradKeepsStorage) {
  Tensor p = parameter({1.0f});
  setGrad(p, {5.0f});
  Tensor before = p.grad();
  Sgd sgd({{"w", p}}, SgdOptions{.lr = 0.1});
  sgd.zeroGrad();
  EXPECT_FLOAT_EQ(p.grad().toFloatVector()[0], 0.0f);
  EXPECT_EQ(p.grad().rawData(), before.rawData());
}

// A part whose gradient is the mean of two arrays (Gradient::other) moves exactly as step()
// with that mean as the gradient, for every update loop, over several steps (the first
// builds the state) and across the vector widths (a part of 25 elements leaves a scalar
// tail); the elements outside the part stay as they were.
TEST(OptimizerTest, PartsWithTheMeanOfTwoGradientsStepAsTheMean) {
  constexpr int64_t kBegin = 5, kEnd = 30;
  std::vector<float> init(37), a(37), b(37), mean(37);
  for (size_t i = 0; i < init.size(); ++i) {
    init[i] = 0.1f * static_cast<float>(i) - 1.3f;
    a[i] = std::sin(static_cast<float>(i)) * 0.7f;
    b[i] = std::cos(static_cast<float>(i) * 1.3f) * 0.4f;
    mean[i] = (a[i] + b[i]) * 0.5f;
  }
  using Make = std::function<std::unique_ptr<Optimizer>(const Tensor&)>;
  const std::vector<std::pair<std::string, Make>> optimizers = {
      {"sgd",
       [](const Tensor& p) {
         return std::make_unique<Sgd>(NamedParameters{{"w", p}}, SgdOptions{.lr = 0.1, .weightDecay = 0.01});
       }},
      {"momentum",
       [](const Tensor& p) {
         return std::make_unique<Sgd>(NamedParameters{{"w", p}}, SgdOptions{.lr = 0.1, .momentum = 0.9});
       }},
      {"nesterov",
       [](const Tensor& p) {
         return std::make_unique<Sgd>(NamedParameters{{"w", p}},
                                      SgdOptions{.lr = 0.1, .momentum = 0.9, .weightDecay = 0.01, .nesterov = true});
       }},
      {"adam",
       [](const Tensor& p) {
         return std::make_unique<Adam>(NamedParameters{{"w", p}}, AdamOptions{.lr = 0.01, .weightDecay = 0.01});
       }},
      {"adamw",
       [](const Tensor& p) { return makeAdamW(NamedParameters{{"w", p}}, AdamOptions{.lr = 0.01, .weightDecay = 0.01}); }},
  };
  for (const auto& [name, make] : optimizers) {
    SCOPED_TRACE(name);
    Tensor whole = parameter(init), parted = parameter(init);
    auto wholeOptimizer = make(whole);
    auto partedOptimizer = make(parted);
    for (int step = 0; step < 3; ++step) {
      setGrad(whole, mean);
      wholeOptimizer->step();
      partedOptimizer->stepParts(
          {{kBegin, kEnd, {.data = a.data() + kBegin, .other = b.data() + kBegin, .scale = 0.5f}}});
    }
    const std::vector<float> expected = whole.toFloatVector(), got = parted.toFloatVector();
    for (int64_t i = 0; i < 37; ++i) {
      if (i >= kBegin && i < kEnd) {
        EXPECT_EQ(got[i], expected[i]) << "element " << i;
      } else {
        EXPECT_EQ(got[i], init[i]) << "element " << i << " is outside the part";
      }
    }
  }
}

// ---- schedules and clipping ----

TEST(ScheduleTest, StepAndCosineInClosedForm) {
  StepLr step(1.0, 10, 0.5);
  EXPECT_DOUBLE_EQ(step.lrAt(9), 1.0);
  EXPECT_DOUBLE_EQ(step.lrAt(10), 0.5);
  EXPECT_DOUBLE_EQ(step.lrAt(25), 0.25);
  CosineLr cosine(1.0, 100, 0.1);
  EXPECT_DOUBLE_EQ(cosine.lrAt(0), 1.0);
  EXPECT_NEAR(cosine.lrAt(50), 0.55, 1e-12);
  EXPECT_NEAR(cosine.lrAt(25), 0.1 + 0.9 * 0.5 * (1 + std::cos(M_PI / 4)), 1e-12);
  EXPECT_DOUBLE_EQ(cosine.lrAt(100), 0.1);
  EXPECT_DOUBLE_EQ(ConstantLr(0.3).lrAt(1000), 0.3);
}

TEST(ScheduleTest, WarmupThenCosine) {
  WarmupLr schedule(std::make_unique<CosineLr>(0.8, 100), 4);
  EXPECT_DOUBLE_EQ(schedule.lrAt(0), 0.2);
  EXPECT_DOUBLE_EQ(schedule.lrAt(1), 0.4);
  EXPECT_DOUBLE_EQ(schedule.lrAt(3), 0.8);
  EXPECT_DOUBLE_EQ(schedule.lrAt(4), 0.8);
  EXPECT_NEAR(schedule.lrAt(54), 0.4, 1e-12);
  WarmupLr fromHalf(std::make_unique<ConstantLr>(1.0), 2, 0.5);
  EXPECT_DOUBLE_EQ(fromHalf.lrAt(0), 0.75);
}

TEST(ClipTest, ScalesToMaxNormAndReturnsTotal) {
  Tensor a = parameter({3.0f, 0.0f});
  Tensor b = parameter({4.0f});
  setGrad(a, {3.0f, 0.0f});
  setGrad(b, {4.0f});
  EXPECT_NEAR(clipGradNorm({a, b}, 1.0), 5.0, 1e-9);
  EXPECT_NEAR(a.grad().toFloatVector()[0], 3.0f / 5.0f, 1e-6);
  EXPECT_NEAR(b.grad().toFloatVector()[0], 4.0f / 5.0f, 1e-6);
  // Below the limit nothing changes.
  EXPECT_NEAR(clipGradNorm({a, b}, 10.0), 1.0, 1e-6);
  EXPECT_NEAR(b.grad().toFloatVector()[0], 4.0f / 5.0f, 1e-6);
}

TEST(ByNameTest, OptimizersAndSchedulesByNameAreTheClassesTheyName) {
  Tensor w = Tensor::fromVector({2}, std::vector<float>{1.0f, 2.0f});
  w.setRequiresGrad(true);
  const NamedParameters parameters{{"w", w}};
  EXPECT_EQ(makeOptimizer({.name = "sgd", .lr = 0.1, .momentum = 0.9, .nesterov = true}, parameters)->kind(), "sgd");
  EXPECT_EQ(makeOptimizer({.name = "adam"}, parameters)->kind(), "adam");
  const auto adamw = makeOptimizer({.name = "adamw", .lr = 2e-3, .beta1 = 0.8, .weightDecay = 0.01}, parameters);
  const auto* adam = dynamic_cast<const Adam*>(adamw.get());
  ASSERT_NE(adam, nullptr);
  EXPECT_TRUE(adam->options().decoupled);
  EXPECT_DOUBLE_EQ(adam->options().beta1, 0.8);
  EXPECT_DOUBLE_EQ(adam->options().weightDecay, 0.01);
  EXPECT_THROW(makeOptimizer({.name = "lamb"}, parameters), InvalidArgument);

  EXPECT_DOUBLE_EQ(makeSchedule({.name = "constant", .lr = 0.5}, 10)->lrAt(7), 0.5);
  EXPECT_DOUBLE_EQ(makeSchedule({.name = "step", .lr = 1.0}, 9)->lrAt(3), 0.3);
  EXPECT_NEAR(makeSchedule({.name = "cosine", .lr = 1.0}, 10)->lrAt(5), 0.5, 1e-12);
  const auto warm = makeSchedule({.name = "warmup-cosine", .lr = 1.0, .warmupSteps = 4}, 14);
  EXPECT_DOUBLE_EQ(warm->lrAt(0), 0.25);  // (s + 1) / W of the way
  EXPECT_DOUBLE_EQ(warm->lrAt(4), 1.0);   // then cosine over the 10 steps left
  EXPECT_NEAR(warm->lrAt(9), 0.5, 1e-12);
  try {
    makeSchedule({.name = "linear"}, 10);
    FAIL() << "accepted an unknown schedule";
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("schedule 'linear' is not accepted"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace kolo::optim
