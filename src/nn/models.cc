// The built-in Fashion-MNIST models, layer for layer the peers' nn.Sequential.
#include "kolo/nn/models.h"

namespace kolo::nn {

std::shared_ptr<Sequential> makeModel(const std::string& name, Generator& gen) {
  auto model = std::make_shared<Sequential>();
  if (name == "mlp") {
    model->add(std::make_shared<Linear>(784, 512, gen));
    model->add(std::make_shared<ReLU>());
    model->add(std::make_shared<Linear>(512, 256, gen));
    model->add(std::make_shared<ReLU>());
    model->add(std::make_shared<Linear>(256, 10, gen));
    return model;
  }
  if (name == "cnn") {
    model->add(std::make_shared<Unflatten>(1, Shape{1, 28, 28}));
    model->add(std::make_shared<Conv2d>(1, 32, 5, gen));
    model->add(std::make_shared<ReLU>());
    model->add(std::make_shared<MaxPool2d>(2));
    model->add(std::make_shared<Conv2d>(32, 64, 5, gen));
    model->add(std::make_shared<ReLU>());
    model->add(std::make_shared<MaxPool2d>(2));
    model->add(std::make_shared<Flatten>());
    model->add(std::make_shared<Linear>(1024, 128, gen));
    model->add(std::make_shared<ReLU>());
    model->add(std::make_shared<Linear>(128, 10, gen));
    return model;
  }
  KOLO_THROW(InvalidArgument, "unknown model '", name, "' (expected mlp or cnn)");
}

}  // namespace kolo::nn
