// The built-in Fashion-MNIST models, layer for layer the peers' nn.Sequential.
#include "kolo/nn/models.h"

namespace kolo::nn {

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
  KOLO_THROW(InvalidArgument, "unknown model '", name, "' (expected mlp or cnn)");
}

}  // namespace kolo::nn
