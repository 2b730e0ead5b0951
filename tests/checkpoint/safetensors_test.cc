// safetensors: byte-exact layout against a hand-assembled file, round trips of every dtype,
// and clear errors for truncated files, bad headers, missing names and wrong shapes.
#include "kolo/safetensors.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <fstream>

#include "support/error_text.h"

namespace kolo::checkpoint {
namespace {

namespace fs = std::filesystem;

std::string tempPath(const std::string& name) {
  return (fs::temp_directory_path() / ("kolo_st_" + std::to_string(::getpid()) + "_" + name))
      .string();
}

std::string readBytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
}

void writeBytes(const std::string& path, const std::string& bytes) {
  std::ofstream(path, std::ios::binary) << bytes;
}

std::string withLength(const std::string& header) {
  std::string bytes(8, '\0');
  for (int i = 0; i < 8; ++i) bytes[i] = static_cast<char>((header.size() >> (8 * i)) & 0xff);
  return bytes + header;
}

using kolo::testing::errorOf;

TEST(SafetensorsTest, LayoutMatchesHandAssembledFile) {
  const std::string path = tempPath("layout.safetensors");
  Tensor a = Tensor::fromVector({2}, std::vector<float>{1.0f, -2.0f});
  Tensor b = Tensor::fromVector({1}, std::vector<int64_t>{7});
  saveSafetensors(path, {{"w", a}, {"b", b}}, {{"format", "pt"}});
  std::string header =
      R"({"__metadata__":{"format":"pt"},"w":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},)"
      R"("b":{"dtype":"I64","shape":[1],"data_offsets":[8,16]}})";
  while ((header.size() + 8) % 8 != 0) header.push_back(' ');
  std::string data(16, '\0');
  const float floats[2] = {1.0f, -2.0f};
  const int64_t seven = 7;
  std::memcpy(data.data(), floats, 8);  // little-endian host, as the format is
  std::memcpy(data.data() + 8, &seven, 8);
  EXPECT_EQ(readBytes(path), withLength(header) + data);
  fs::remove(path);
}

TEST(SafetensorsTest, RoundTripKeepsOrderDtypesAndMetadata) {
  const std::string path = tempPath("round.safetensors");
  Generator gen(3);
  NamedTensors tensors = {
      {"z.last", Tensor::randn({3, 4}, gen)},
      {"a.first", Tensor::randn({2, 2, 2}, gen, 0.0, 1.0, DType::F64)},
      {"half", Tensor::randn({5}, gen).to(DType::F16)},
      {"brain", Tensor::randn({5}, gen).to(DType::BF16)},
      {"ints", Tensor::fromVector({3}, std::vector<int64_t>{1, -2, 3}).to(DType::I32)},
      {"bytes", Tensor::fromVector({2}, std::vector<int64_t>{0, 255}).to(DType::U8)},
      {"scalar", Tensor::scalar(4.5)},
      {"view", Tensor::randn({3, 4}, gen).t()},
  };
  saveSafetensors(path, tensors, {{"step", "12"}});
  SafetensorsFile file = loadSafetensors(path);
  ASSERT_EQ(file.tensors.size(), tensors.size());
  EXPECT_EQ(file.metadata.at("step"), "12");
  for (size_t i = 0; i < tensors.size(); ++i) {
    EXPECT_EQ(file.tensors[i].first, tensors[i].first);
    EXPECT_EQ(file.tensors[i].second.dtype(), tensors[i].second.dtype());
    EXPECT_EQ(file.tensors[i].second.shape(), tensors[i].second.shape());
    EXPECT_EQ(file.tensors[i].second.toDoubleVector(), tensors[i].second.toDoubleVector())
        << tensors[i].first;
  }
  EXPECT_FALSE(fs::exists(path + ".tmp." + std::to_string(::getpid())));
  fs::remove(path);
}

TEST(SafetensorsTest, TruncatedFileIsRefused) {
  const std::string path = tempPath("trunc.safetensors");
  saveSafetensors(path, {{"w", Tensor::ones({16})}});
  std::string bytes = readBytes(path);
  writeBytes(path, bytes.substr(0, bytes.size() - 10));
  std::string message = errorOf([&] { loadSafetensors(path); });
  EXPECT_NE(message.find(path), std::string::npos) << message;
  EXPECT_NE(message.find("truncated"), std::string::npos) << message;
  writeBytes(path, bytes.substr(0, 5));
  message = errorOf([&] { loadSafetensors(path); });
  EXPECT_NE(message.find("truncated"), std::string::npos) << message;
  fs::remove(path);
}

TEST(SafetensorsTest, BadHeadersAreRefused) {
  const std::string path = tempPath("bad.safetensors");
  writeBytes(path, withLength("{not json"));
  EXPECT_NE(errorOf([&] { loadSafetensors(path); }).find("not valid JSON"), std::string::npos);
  writeBytes(path, std::string("\xff\xff\xff\xff\xff\xff\x00\x00", 8) + "{}");
  EXPECT_NE(errorOf([&] { loadSafetensors(path); }).find("bad safetensors header length"),
            std::string::npos);
  writeBytes(path,
             withLength(R"({"w":{"dtype":"F99","shape":[1],"data_offsets":[0,4]}})") + "abcd");
  EXPECT_NE(errorOf([&] { loadSafetensors(path); }).find("unsupported dtype"), std::string::npos);
  writeBytes(path,
             withLength(R"({"w":{"dtype":"F32","shape":[2],"data_offsets":[0,4]}})") + "abcd");
  EXPECT_NE(errorOf([&] { loadSafetensors(path); }).find("needs 8"), std::string::npos);
  EXPECT_THROW(loadSafetensors(tempPath("does_not_exist")), IoError);
  fs::remove(path);
}

TEST(SafetensorsTest, LoadIntoChecksNamesAndShapes) {
  const std::string path = tempPath("into.safetensors");
  Generator gen(1);
  Tensor saved0 = Tensor::randn({512, 784}, gen);
  Tensor saved1 = Tensor::randn({512}, gen);
  saveSafetensors(path, {{"0.weight", saved0}, {"0.bias", saved1}});

  Tensor weight = Tensor::zeros({512, 784});
  Tensor bias = Tensor::zeros({512});
  weight.setRequiresGrad(true);
  loadSafetensorsInto(path, {{"0.weight", weight}, {"0.bias", bias}});
  EXPECT_EQ(weight.toFloatVector(), saved0.toFloatVector());
  EXPECT_EQ(bias.toFloatVector(), saved1.toFloatVector());

  Tensor small = Tensor::zeros({256, 784});
  std::string message = errorOf([&] {
    loadSafetensorsInto(path, {{"0.weight", small}, {"0.bias", bias}});
  });
  EXPECT_NE(message.find("0.weight: file has [512, 784], model expects [256, 784]"),
            std::string::npos)
      << message;
  EXPECT_NE(message.find(path), std::string::npos) << message;
  EXPECT_EQ(small.toFloatVector()[0], 0.0f);  // nothing copied on failure

  message = errorOf([&] { loadSafetensorsInto(path, {{"0.weight", weight}, {"2.bias", bias}}); });
  EXPECT_NE(message.find("2.bias: missing from the file"), std::string::npos) << message;
  EXPECT_NE(message.find("0.bias: in the file but not in the model"), std::string::npos) << message;
  // Non-strict loading takes what matches.
  EXPECT_NO_THROW(loadSafetensorsInto(path, {{"0.weight", weight}}, false));
  fs::remove(path);
}

}  // namespace
}  // namespace kolo::checkpoint
