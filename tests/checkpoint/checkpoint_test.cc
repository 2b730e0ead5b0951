// Tests of CheckpointManager: exact round trip of weights, optimizer state, loader position
// and RNG; continuation after a restore is bit-identical; keep-last-K; truncated and
// corrupt checkpoints are refused by name and the previous good one is used.
#include "kolo/checkpoint.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>

#include "kolo/error.h"

namespace kolo::checkpoint {
namespace {
namespace fs = std::filesystem;

struct TempDir {
  fs::path path;
  TempDir() {
    path = fs::temp_directory_path() / ("kolo_ckpt_test_" + std::to_string(::getpid()) + "_" +
                                        std::to_string(reinterpret_cast<uintptr_t>(this)));
    fs::remove_all(path);
  }
  ~TempDir() { fs::remove_all(path); }
};

NamedTensors makeWeights(uint64_t seed) {
  Generator gen(seed);
  NamedTensors w;
  w.emplace_back("0.weight", Tensor::randn({4, 3}, gen));
  w.emplace_back("0.bias", Tensor::randn({4}, gen));
  for (auto& [n, t] : w) t.setRequiresGrad(true);
  return w;
}

// Gives every parameter a gradient that depends on the step and takes one optimizer step.
void fakeStep(const NamedTensors& w, optim::Optimizer& opt, int step) {
  for (const auto& [n, t] : w) {
    Tensor g = Tensor::empty(t.shape());
    float* gd = g.data<float>();
    const float* pd = t.data<float>();
    for (int64_t i = 0; i < t.numel(); ++i)
      gd[i] = 0.1f * pd[i] + 0.01f * static_cast<float>(step + i);
    Tensor(t).setGrad(g);
  }
  opt.step();
}

TrainingState atStep(int64_t step) {
  TrainingState state;
  state.step = step;
  return state;
}

std::vector<float> flat(const NamedTensors& w) {
  std::vector<float> out;
  for (const auto& [n, t] : w) {
    auto v = t.toFloatVector();
    out.insert(out.end(), v.begin(), v.end());
  }
  return out;
}

TEST(Checkpoint, RoundTripRestoresEverythingAndContinuesBitIdentically) {
  TempDir dir;
  NamedTensors w = makeWeights(1);
  optim::Sgd opt(w, {.lr = 0.1, .momentum = 0.9});
  for (int s = 0; s < 3; ++s) fakeStep(w, opt, s);
  Generator rng(77);
  rng.nextU64();
  TrainingState state;
  state.step = 3;
  state.epoch = 1;
  state.loader = {1, 5};
  state.rng = rng.state();
  state.extra = {{"model", "toy"}};
  CheckpointManager mgr(dir.path.string(), 2);
  const std::string path = mgr.save(w, &opt, state);
  EXPECT_TRUE(fs::exists(fs::path(path) / "model.safetensors"));

  // Continue the original run two more steps.
  for (int s = 3; s < 5; ++s) fakeStep(w, opt, s);

  NamedTensors w2 = makeWeights(2);
  optim::Sgd opt2(w2, {.lr = 0.1, .momentum = 0.9});
  auto restored = mgr.restoreLatest(w2, &opt2);
  ASSERT_TRUE(restored.has_value());
  EXPECT_EQ(restored->step, 3);
  EXPECT_EQ(restored->epoch, 1);
  EXPECT_EQ(restored->loader.epoch, 1);
  EXPECT_EQ(restored->loader.batch, 5);
  EXPECT_EQ(restored->rng, rng.state());
  EXPECT_EQ(restored->extra.at("model"), "toy");
  EXPECT_EQ(opt2.stepCount(), 3);
  Generator rng2(0);
  rng2.setState(restored->rng);
  EXPECT_EQ(rng2.nextU64(), Generator(rng).nextU64());
  for (int s = 3; s < 5; ++s) fakeStep(w2, opt2, s);
  EXPECT_EQ(flat(w2), flat(w));  // bit-identical, momentum included
}

TEST(Checkpoint, KeepsOnlyTheLastK) {
  TempDir dir;
  NamedTensors w = makeWeights(1);
  CheckpointManager mgr(dir.path.string(), 2);
  for (int s = 1; s <= 5; ++s) mgr.save(w, nullptr, atStep(s));
  auto all = mgr.list();
  ASSERT_EQ(all.size(), 2u);
  EXPECT_EQ(all[0].step, 4);
  EXPECT_EQ(all[1].step, 5);
  for (const auto& e : fs::directory_iterator(dir.path))
    EXPECT_EQ(e.path().filename().string().rfind(".tmp", 0), std::string::npos);
}

// read() gives the stored tensors whole, for callers that cut their own parts.
TEST(Checkpoint, ReadGivesEveryFileWhole) {
  TempDir dir;
  NamedTensors w = makeWeights(3);
  optim::Sgd opt(w, {.lr = 0.1, .momentum = 0.9});
  fakeStep(w, opt, 0);
  CheckpointManager mgr(dir.path.string());
  const std::string path = mgr.save(w, &opt, atStep(7));
  const CheckpointContents contents = CheckpointManager::read(path);
  EXPECT_EQ(contents.state.step, 7);
  EXPECT_EQ(flat(contents.weights), flat(w));
  EXPECT_EQ(contents.optimizerKind, "sgd");
  EXPECT_EQ(contents.optimizerScalars.at("step"), 1.0);
  ASSERT_EQ(contents.optimizerTensors.size(), 2u);
  const optim::StateDict state =
      optim::StateDict::fromFlat(contents.optimizerTensors, contents.optimizerScalars);
  EXPECT_EQ(state.perParameter.at("0.weight").at("momentum_buffer").toFloatVector(),
            opt.stateDict().perParameter.at("0.weight").at("momentum_buffer").toFloatVector());
  // A damaged file is refused as by load().
  std::ofstream(fs::path(path) / "model.safetensors", std::ios::app) << "x";
  EXPECT_THROW(CheckpointManager::read(path), FormatError);
}

TEST(Checkpoint, NonWriterRanksWriteNothing) {
  TempDir dir;
  CheckpointManager mgr(dir.path.string(), 2, /*writer=*/false);
  EXPECT_EQ(mgr.save(makeWeights(1), nullptr, atStep(1)), "");
  EXPECT_FALSE(fs::exists(dir.path / "ckpt-000000001"));
}

class DamagedCheckpoint : public ::testing::TestWithParam<std::string> {};

TEST_P(DamagedCheckpoint, IsRefusedAndThePreviousGoodOneIsUsed) {
  TempDir dir;
  std::vector<std::string> warnings;
  CheckpointManager mgr(dir.path.string(), 3, true,
                        [&](const std::string& w) { warnings.push_back(w); });
  NamedTensors w = makeWeights(1);
  optim::Sgd opt(w, {.lr = 0.1, .momentum = 0.9});
  fakeStep(w, opt, 0);
  mgr.save(w, &opt, atStep(1));
  const auto good = flat(w);
  fakeStep(w, opt, 1);
  const std::string newest = mgr.save(w, &opt, atStep(2));

  const std::string damage = GetParam();
  std::string expect;
  if (damage == "truncate") {
    const fs::path f = fs::path(newest) / "model.safetensors";
    fs::resize_file(f, fs::file_size(f) / 2);
    expect = "truncated";
  } else if (damage == "flip") {
    const fs::path f = fs::path(newest) / "optimizer.safetensors";
    std::fstream io(f, std::ios::in | std::ios::out | std::ios::binary);
    io.seekp(static_cast<std::streamoff>(fs::file_size(f) - 3));
    io.put('\x5a');
    expect = "CRC32";
  } else if (damage == "manifest") {
    const fs::path f = fs::path(newest) / "meta.json";
    std::string text;
    {
      std::ifstream in(f);
      text.assign(std::istreambuf_iterator<char>(in), {});
    }
    text.replace(text.find("\"step\": 2"), 9, "\"step\": 9");
    std::ofstream(f) << text;
    expect = "checksum";
  } else {
    fs::remove(fs::path(newest) / "meta.json");
    expect = "missing";
  }

  try {
    CheckpointManager::verify(newest);
    FAIL() << "damaged checkpoint verified";
  } catch (const FormatError& e) {
    EXPECT_NE(std::string(e.what()).find(expect), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find(newest), std::string::npos) << e.what();
  }
  NamedTensors w2 = makeWeights(3);
  optim::Sgd opt2(w2, {.lr = 0.1, .momentum = 0.9});
  EXPECT_THROW(CheckpointManager::load(newest, w2, &opt2), FormatError);
  auto state = mgr.restoreLatest(w2, &opt2);
  ASSERT_TRUE(state.has_value());
  EXPECT_EQ(state->step, 1);
  EXPECT_EQ(flat(w2), good);
  ASSERT_EQ(warnings.size(), 1u);
  EXPECT_NE(warnings[0].find(newest), std::string::npos) << warnings[0];
  EXPECT_NE(warnings[0].find(expect), std::string::npos) << warnings[0];
}

INSTANTIATE_TEST_SUITE_P(Damage, DamagedCheckpoint,
                         ::testing::Values("truncate", "flip", "manifest", "nomanifest"));

TEST(Checkpoint, OptimizerKindMismatchIsAClearError) {
  TempDir dir;
  NamedTensors w = makeWeights(1);
  optim::Sgd opt(w, {.lr = 0.1, .momentum = 0.9});
  fakeStep(w, opt, 0);
  CheckpointManager mgr(dir.path.string());
  const std::string path = mgr.save(w, &opt, atStep(1));
  optim::Adam adam(w, {});
  try {
    CheckpointManager::load(path, w, &adam);
    FAIL();
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("sgd"), std::string::npos) << e.what();
  }
  EXPECT_FALSE(CheckpointManager(dir.path.string() + "/none").latestGood().has_value());
}

}  // namespace
}  // namespace kolo::checkpoint
