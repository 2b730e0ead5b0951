// The built-in models, layer for layer the peers' PyTorch definitions.
#include "kolo/nn/models.h"

namespace kolo::nn {

BasicBlock::BasicBlock(int64_t in, int64_t out, int64_t stride, Generator& gen) {
  conv1 = registerModule("conv1", std::make_shared<Conv2d>(in, out, 3, gen, stride, 1, /*bias=*/false));
  bn1 = registerModule("bn1", std::make_shared<BatchNorm2d>(out));
  conv2 = registerModule("conv2", std::make_shared<Conv2d>(out, out, 3, gen, 1, 1, /*bias=*/false));
  bn2 = registerModule("bn2", std::make_shared<BatchNorm2d>(out));
  shortcut = registerModule("shortcut", std::make_shared<Sequential>());
  if (stride != 1 || in != out) {
    shortcut->add(std::make_shared<Conv2d>(in, out, 1, gen, stride, 0, /*bias=*/false));
    shortcut->add(std::make_shared<BatchNorm2d>(out));
  }
}

Tensor BasicBlock::forward(const Tensor& x) {
  if (bn1->hasHooks() || bn2->hasHooks()) {  // hooks see each batch norm's own output
    const Tensor y = relu((*bn1)((*conv1)(x)));  // (N, out, H / stride, W / stride)
    return relu((*bn2)((*conv2)(y)) + (*shortcut)(x));
  }
  // The same steps, each batch norm with the addition and ReLU after it in one pass.
  const Tensor y = bn1->forwardRelu((*conv1)(x));
  const Tensor main = (*conv2)(y);
  const Tensor skip = (*shortcut)(x);
  return bn2->forwardRelu(main, skip);
}

std::shared_ptr<Sequential> makeModel(const std::string& name, Generator& gen) { return makeModel(name, gen, {}); }

std::shared_ptr<Sequential> makeModel(const std::string& name, Generator& gen, const ModelData& data) {
  KOLO_REQUIRE(data.channels >= 1 && data.height >= 1 && data.width >= 1 && data.classes >= 1, "model '", name,
               "': samples of ", data.channels, "x", data.height, "x", data.width, " and ", data.classes,
               " classes (each must be at least 1)");
  auto model = std::make_shared<Sequential>();
  // (B, C*H*W) after two 5x5 convolutions, each followed by 2x2 pooling.
  const int64_t pooledHeight = ((data.height - 4) / 2 - 4) / 2, pooledWidth = ((data.width - 4) / 2 - 4) / 2;
  if (name == "mlp") {
    model->add(std::make_shared<Linear>(data.channels * data.height * data.width, 512, gen));
    model->add(std::make_shared<ReLU>());
    model->add(std::make_shared<Linear>(512, 256, gen));
    model->add(std::make_shared<ReLU>());
    model->add(std::make_shared<Linear>(256, data.classes, gen));
    return model;
  }
  if (name == "cnn") {
    KOLO_REQUIRE(data.height >= 12 && data.width >= 12, "model 'cnn' needs images of at least 12x12, got ",
                 data.height, "x", data.width);
    model->add(std::make_shared<Unflatten>(1, Shape{data.channels, data.height, data.width}));
    model->add(std::make_shared<Conv2d>(data.channels, 32, 5, gen));
    model->add(std::make_shared<ReLU>());
    model->add(std::make_shared<MaxPool2d>(2));
    model->add(std::make_shared<Conv2d>(32, 64, 5, gen));
    model->add(std::make_shared<ReLU>());
    model->add(std::make_shared<MaxPool2d>(2));
    model->add(std::make_shared<Flatten>());
    model->add(std::make_shared<Linear>(64 * pooledHeight * pooledWidth, 128, gen));
    model->add(std::make_shared<ReLU>());
    model->add(std::make_shared<Linear>(128, data.classes, gen));
    return model;
  }
  if (name == "resnet") {
    model->add("unflatten", std::make_shared<Unflatten>(1, Shape{data.channels, data.height, data.width}));
    model->add("conv1", std::make_shared<Conv2d>(data.channels, 16, 3, gen, 1, 1, /*bias=*/false));
    model->add("bn1", std::make_shared<BatchNorm2d>(16));
    model->add("relu", std::make_shared<ReLU>());
    model->add("layer1", std::make_shared<BasicBlock>(16, 16, 1, gen));
    model->add("layer2", std::make_shared<BasicBlock>(16, 32, 2, gen));
    model->add("layer3", std::make_shared<BasicBlock>(32, 64, 2, gen));
    model->add("pool", std::make_shared<AdaptiveAvgPool2d>(1));
    model->add("flatten", std::make_shared<Flatten>());
    model->add("fc", std::make_shared<Linear>(64, data.classes, gen));
    return model;
  }
  KOLO_THROW(InvalidArgument, "unknown model '", name, "' (expected mlp, cnn or resnet)");
}

}  // namespace kolo::nn
