// A federated client's local training: plain SGD (optionally FedProx's proximal term) from
// the global weights over the client's own samples, returning the update (local - global),
// clipped for DP-FedAvg. The model's state travels as one flat f32 vector: its parameters in
// namedParameters() order, then its buffers (a batch norm's running statistics) in namedBuffers()
// order.
#include <algorithm>
#include <cmath>
#include <cstring>

#include "kolo/autograd.h"
#include "kolo/error.h"
#include "kolo/ops.h"
#include "kolo/optim.h"
#include "kolo/parallel/federated.h"
#include "parallel/federated/detail.h"

namespace kolo::parallel::fed {

std::vector<float> flattenState(const nn::Module& model) {
  std::vector<float> flat;
  for (const auto& [name, parameter] : model.namedParameters()) {
    const Tensor values = parameter.contiguous();
    const float* p = values.data<float>();
    flat.insert(flat.end(), p, p + values.numel());
  }
  for (const auto& [name, buffer] : model.namedBuffers()) {
    const std::vector<float> values = buffer.toFloatVector();
    flat.insert(flat.end(), values.begin(), values.end());
  }
  return flat;
}

void loadState(nn::Module& model, const std::vector<float>& flat) {
  auto parameters = model.namedParameters();
  auto buffers = model.namedBuffers();
  size_t total = 0;
  for (const auto& [name, parameter] : parameters) total += static_cast<size_t>(parameter.numel());
  for (const auto& [name, buffer] : buffers) total += static_cast<size_t>(buffer.numel());
  if (flat.size() != total)
    KOLO_THROW(Mismatch, "federated: ", flat.size(),
               " values for a model whose parameters and buffers hold ", total);
  size_t offset = 0;
  for (auto& [name, parameter] : parameters) {
    KOLO_REQUIRE(parameter.isContiguous(), "federated: parameter ", name, " is not contiguous");
    std::memcpy(parameter.data<float>(), flat.data() + offset, parameter.nbytes());
    offset += static_cast<size_t>(parameter.numel());
  }
  for (auto& [name, buffer] : buffers) {
    KOLO_REQUIRE(buffer.isContiguous(), "federated: buffer ", name, " is not contiguous");
    // A counter (num_batches_tracked) comes back as the clients' weighted mean: the nearest
    // whole count.
    const bool integer =
        buffer.dtype() == DType::I32 || buffer.dtype() == DType::I64 || buffer.dtype() == DType::U8;
    for (int64_t i = 0; i < buffer.numel(); ++i) {
      const double value = flat[offset + static_cast<size_t>(i)];
      storeElement(buffer.dtype(), buffer.rawData(), static_cast<size_t>(i),
                   integer ? std::round(value) : value);
    }
    offset += static_cast<size_t>(buffer.numel());
  }
}

Method parseMethod(const std::string& name) {
  if (name == "fedavg") return Method::FedAvg;
  if (name == "fedprox") return Method::FedProx;
  KOLO_THROW(InvalidArgument, "parseMethod '", name, "' is not accepted: use fedavg or fedprox");
}

std::vector<int64_t> clientEpochOrder(const std::vector<int64_t>& indices,
                                      const LocalTrainingOptions& options, int64_t round, int client,
                                      int64_t epoch) {
  std::vector<int64_t> order = indices;
  if (!options.shuffle) return order;
  Generator generator(
      detail::mixSeed(options.seed, 0xc11e47 + static_cast<uint64_t>(client),
                      static_cast<uint64_t>(round) * 1000003ULL + static_cast<uint64_t>(epoch)));
  for (size_t i = order.size(); i > 1; --i) {
    const size_t j = static_cast<size_t>(generator.nextU64() % i);
    std::swap(order[i - 1], order[j]);
  }
  return order;
}

std::vector<float> trainClient(nn::Module& model, const std::vector<float>& global,
                               const data::Dataset& data, const std::vector<int64_t>& indices,
                               const LocalTrainingOptions& options, int64_t round, int client) {
  KOLO_REQUIRE(!indices.empty(), "federated: client ", client, " holds no samples");
  KOLO_REQUIRE(options.localEpochs >= 1, "federated: LocalTrainingOptions::localEpochs must be at least 1, got ",
               options.localEpochs);
  KOLO_REQUIRE(options.localBatch >= 0, "federated: LocalTrainingOptions::localBatch must be at least 0, got ",
               options.localBatch);
  loadState(model, global);
  model.train(true);
  optim::NamedParameters named = model.namedParameters();
  optim::Sgd sgd(named, optim::SgdOptions{.lr = options.lr});
  const bool prox = options.method == Method::FedProx && options.proxMu > 0.0;
  const int64_t n = static_cast<int64_t>(indices.size());
  const int64_t batch = options.localBatch == 0 ? n : std::min(options.localBatch, n);
  for (int64_t epoch = 0; epoch < options.localEpochs; ++epoch) {
    const std::vector<int64_t> order = clientEpochOrder(indices, options, round, client, epoch);
    for (int64_t begin = 0; begin < n; begin += batch) {
      const std::vector<int64_t> ids(order.begin() + begin,
                                     order.begin() + std::min(n, begin + batch));
      const data::Batch b = data.gather(ids);
      sgd.zeroGrad();
      Tensor loss = crossEntropy(model.forward(b.inputs), b.labels);
      loss.backward();
      if (prox) {
        // FedProx: the gradient of mu/2 ||w - w_global||^2 is mu (w - w_global).
        size_t offset = 0;
        for (auto& [name, parameter] : named) {
          Tensor grad = parameter.grad();
          float* g = grad.data<float>();
          const float* w = parameter.data<float>();
          const float mu = static_cast<float>(options.proxMu);
          for (int64_t i = 0; i < parameter.numel(); ++i) g[i] += mu * (w[i] - global[offset + i]);
          offset += static_cast<size_t>(parameter.numel());
        }
      }
      sgd.step();
    }
  }
  std::vector<float> delta = flattenState(model);
  for (size_t i = 0; i < delta.size(); ++i) delta[i] -= global[i];
  if (options.dpClip > 0.0) {
    double norm = 0.0;
    for (float v : delta) norm += static_cast<double>(v) * v;
    norm = std::sqrt(norm);
    if (norm > options.dpClip) {
      const float scale = static_cast<float>(options.dpClip / norm);
      for (float& v : delta) v *= scale;
    }
  }
  return delta;
}

}  // namespace kolo::parallel::fed
