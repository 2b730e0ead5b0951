// The built-in models, exactly the peers' PyTorch definitions (make_model in
// bench/peers/torch_ddp_fmnist.py, the ResNet in bench/peers/torch_resnet.py), so parameter
// and buffer names equal PyTorch's state_dict keys.
#pragma once

#include <memory>
#include <string>

#include "kolo/nn/layers.h"

namespace kolo::nn {

/// "mlp": Linear(784,512)-ReLU-Linear(512,256)-ReLU-Linear(256,10)
///        (names 0.weight, 0.bias, 2.*, 4.*).
/// "cnn": Unflatten(1,(1,28,28))-Conv2d(1,32,5)-ReLU-MaxPool(2)-Conv2d(32,64,5)-ReLU-
///        MaxPool(2)-Flatten-Linear(1024,128)-ReLU-Linear(128,10) (names 1.*, 4.*, 8.*, 10.*).
/// "resnet": a residual network of three BasicBlocks, PyTorch's ResNet of issue #42 module
///        for module (bench/peers/torch_resnet.py): unflatten-conv1-bn1-relu-layer1(16)-
///        layer2(32, stride 2)-layer3(64, stride 2)-pool (global average)-flatten-fc, children
///        named so that the state dict's keys are that definition's ("conv1.weight",
///        "bn1.running_mean", "layer2.shortcut.0.weight", "fc.bias", ...).
/// Each takes f32 [B, 784] pixels/255 and returns logits [B, 10]. Parameters are drawn from
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
/// defaults give makeModel(name, gen)'s. The resnet's conv1 takes `channels` and its fc gives
/// `classes` (any image size: it ends in a global average). Throws InvalidArgument for an
/// image smaller than 12x12 (cnn) or sizes below 1.
std::shared_ptr<Sequential> makeModel(const std::string& name, Generator& gen, const ModelData& data);

/// The residual block of ResNet-18/34 (torch's BasicBlock as the issue defines it):
/// relu(bn2(conv2(relu(bn1(conv1(x))))) + shortcut(x)), 3x3 convolutions without bias, the
/// first with `stride`; the shortcut an empty Sequential (identity), or a 1x1 convolution
/// with `stride` and a BatchNorm2d where the stride or the channel count changes. Children
/// conv1, bn1, conv2, bn2, shortcut, in PyTorch's order. Forward takes each batch norm with
/// the addition and ReLU after it as one op (BatchNorm::forwardRelu), and the three steps
/// apart where a hook is registered on bn1 or bn2.
class BasicBlock : public Module {
 public:
  BasicBlock(int64_t in, int64_t out, int64_t stride, Generator& gen);
  Tensor forward(const Tensor& x) override;

  std::shared_ptr<Conv2d> conv1, conv2;
  std::shared_ptr<BatchNorm2d> bn1, bn2;
  std::shared_ptr<Sequential> shortcut;
};

}  // namespace kolo::nn
