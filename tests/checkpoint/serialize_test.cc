// Tests of kolo::save / kolo::load of a module: parameters and buffers round-trip exactly
// under their state_dict names, and a file that does not fit the module is refused with the
// file and every missing, unexpected or mis-shaped name in the message.
#include "kolo/serialize.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>

#include "kolo/error.h"
#include "kolo/nn/layers.h"
#include "kolo/safetensors.h"

namespace kolo {
namespace {
namespace fs = std::filesystem;

struct TempFile {
  std::string path;
  explicit TempFile(const std::string& name)
      : path((fs::temp_directory_path() / ("kolo_serialize_" + std::to_string(::getpid()) + "_" + name))
                 .string()) {}
  ~TempFile() { fs::remove(path); }
};

std::shared_ptr<nn::Sequential> net(uint64_t seed, int64_t hidden = 4) {
  Generator gen(seed);
  auto model = std::make_shared<nn::Sequential>();
  model->add(std::make_shared<nn::Linear>(3, hidden, gen));
  model->add(std::make_shared<nn::BatchNorm1d>(hidden));
  model->add(std::make_shared<nn::ReLU>());
  model->add(std::make_shared<nn::Linear>(hidden, 2, gen));
  return model;
}

TEST(Serialize, SaveThenLoadRestoresParametersAndBuffers) {
  TempFile file("round_trip.safetensors");
  auto saved = net(1);
  Generator gen(2);
  saved->forward(Tensor::randn({8, 3}, gen));  // running statistics away from their init
  save(*saved, file.path);

  // The file holds exactly the state dict, in order, under PyTorch's names.
  const checkpoint::SafetensorsFile contents = checkpoint::loadSafetensors(file.path);
  const auto state = saved->stateDict();
  ASSERT_EQ(contents.tensors.size(), state.size());
  for (size_t i = 0; i < state.size(); ++i) {
    EXPECT_EQ(contents.tensors[i].first, state[i].first);
    EXPECT_EQ(contents.tensors[i].second.dtype(), state[i].second.dtype());
  }
  EXPECT_TRUE(contents.find("1.running_var").defined());
  EXPECT_EQ(contents.find("1.num_batches_tracked").dtype(), DType::I64);

  auto loaded = net(3);
  load(*loaded, file.path);
  const auto after = loaded->stateDict();
  for (size_t i = 0; i < state.size(); ++i)
    EXPECT_EQ(after[i].second.toDoubleVector(), state[i].second.toDoubleVector()) << state[i].first;
  saved->train(false);
  loaded->train(false);
  Tensor x = Tensor::randn({5, 3}, gen);
  EXPECT_EQ(loaded->forward(x).toFloatVector(), saved->forward(x).toFloatVector());
}

std::string loadError(nn::Module& module, const std::string& path) {
  try {
    load(module, path);
  } catch (const InvalidArgument& e) {
    return e.what();
  }
  return "no error";
}

TEST(Serialize, LoadNamesTheFileAndEveryBadKey) {
  TempFile wide("wide.safetensors"), partial("partial.safetensors"), extra("extra.safetensors");
  save(*net(4, 6), wide.path);
  auto model = net(5);
  const std::vector<float> before = model->namedParameters()[0].second.toFloatVector();

  std::string what = loadError(*model, wide.path);
  EXPECT_NE(what.find("cannot load " + wide.path), std::string::npos) << what;
  EXPECT_NE(what.find("0.weight: state has [6, 3], module expects [4, 3]"), std::string::npos) << what;
  EXPECT_NE(what.find("1.running_mean: state has [6], module expects [4]"), std::string::npos) << what;

  auto state = model->stateDict();
  state.erase(state.begin() + 4);  // 1.running_mean
  checkpoint::saveSafetensors(partial.path, state);
  what = loadError(*model, partial.path);
  EXPECT_NE(what.find("1.running_mean: missing from the " + partial.path), std::string::npos) << what;

  state = model->stateDict();
  state.emplace_back("4.weight", Tensor::zeros({2}));
  checkpoint::saveSafetensors(extra.path, state);
  what = loadError(*model, extra.path);
  EXPECT_NE(what.find("4.weight: in the " + extra.path + " but not in the module"), std::string::npos)
      << what;

  EXPECT_EQ(model->namedParameters()[0].second.toFloatVector(), before);  // nothing copied
  EXPECT_THROW(load(*model, wide.path + ".absent"), IoError);
}

}  // namespace
}  // namespace kolo
