// The built-in models, exactly the peers' torch.nn.Sequential definitions
// (make_model in bench/peers/torch_ddp_fmnist.py), so parameter names equal PyTorch's
// state_dict keys.
#pragma once

#include <memory>
#include <string>

#include "kolo/nn/layers.h"

namespace kolo::nn {

/// "mlp": Linear(784,512)-ReLU-Linear(512,256)-ReLU-Linear(256,10)
///        (names 0.weight, 0.bias, 2.*, 4.*).
/// "cnn": Unflatten(1,(1,28,28))-Conv2d(1,32,5)-ReLU-MaxPool(2)-Conv2d(32,64,5)-ReLU-
///        MaxPool(2)-Flatten-Linear(1024,128)-ReLU-Linear(128,10) (names 1.*, 4.*, 8.*, 10.*).
/// Both take f32 [B, 784] pixels/255 and return logits [B, 10]. Parameters are drawn from
/// gen in registration order. Throws InvalidArgument for any other name.
std::shared_ptr<Sequential> makeModel(const std::string& name, Generator& gen);

/// What a built-in model's first and last layers follow: the samples (flat f32 of channels x
/// height x width elements; a table's features are 1 x 1 x F) and the classes.
struct ModelData {
  int64_t channels = 1, height = 28, width = 28;
  int64_t classes = 10;
};

/// The same models sized for `data`: the mlp's first Linear takes channels*height*width
/// inputs and its last gives `classes` logits; the cnn unflattens to (channels, height, width)
/// and its first Linear takes 64 * ((height-4)/2-4)/2 * ((width-4)/2-4)/2 features. The
/// defaults give makeModel(name, gen)'s. Throws InvalidArgument for an image smaller than
/// 12x12 (cnn) or sizes below 1.
std::shared_ptr<Sequential> makeModel(const std::string& name, Generator& gen, const ModelData& data);

}  // namespace kolo::nn
