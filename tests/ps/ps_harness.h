// Shared set-up of the parameter-server tests: the mlp on the first Fashion-MNIST images,
// servers and workers as threads of the test talking over real loopback sockets, and the
// one-device run they are compared with.
#pragma once

#include <chrono>
#include <functional>
#include <memory>
#include <thread>
#include <vector>

#include "kolo/autograd.h"
#include "kolo/data.h"
#include "kolo/nn/models.h"
#include "kolo/ops.h"
#include "kolo/parallel/parameter_server.h"
#include "parallel/toy_setup.h"
#include "support/fashion_mnist.h"

namespace kolo::parallel::ps::testing {

inline constexpr char kToken[] = "ps-test-token";

struct Samples {
  Tensor x;  // f32 [n, 784]
  Tensor y;  // i64 [n]
};

/// The first `n` training images (tests start with KOLO_SKIP_WITHOUT_FASHION_MNIST()).
inline Samples firstSamples(int64_t n) {
  const data::FashionMnist first(data::kFashionMnistDir, true, n);
  return {first.inputs(), first.labels()};
}

inline std::shared_ptr<nn::Module> makeMlp() {
  Generator gen(1234);
  return nn::makeModel("mlp", gen);
}

/// Mean cross-entropy of `model` on rows [begin, end) of `data`, backward into .grad().
inline double lossAndGradients(nn::Module& model, const Samples& data, int64_t begin, int64_t end) {
  for (auto& [name, p] : model.namedParameters()) p.zeroGrad();
  Tensor loss = crossEntropy(model.forward(data.x.slice(0, begin, end).contiguous()),
                                 data.y.slice(0, begin, end).contiguous());
  loss.backward();
  return loss.item();
}

/// P servers serving on threads until destroyed.
class ServerThreads {
 public:
  ServerThreads(int servers, int workers, Mode mode, int staleness, const Placement& placement,
                const OptimizerFactory& makeOptimizer,
                std::chrono::milliseconds timeout = std::chrono::seconds(60)) {
    auto initial = makeMlp();
    for (int s = 0; s < servers; ++s) {
      ServerOptions options;
      options.index = s;
      options.workers = workers;
      options.mode = mode;
      options.staleness = staleness;
      options.token = kToken;
      options.timeout = timeout;
      servers_.push_back(std::make_unique<ParameterServer>(
          options, placement, initial->namedParameters(), makeOptimizer, nullptr));
      addresses_.push_back("127.0.0.1:" + std::to_string(servers_.back()->port()));
    }
    for (auto& server : servers_) threads_.emplace_back([&server] { server->serve(); });
  }
  ~ServerThreads() {
    for (auto& server : servers_) server->stop();
    for (auto& t : threads_) t.join();
  }
  const std::vector<std::string>& addresses() const { return addresses_; }
  ParameterServer& server(int s) { return *servers_[static_cast<size_t>(s)]; }

 private:
  std::vector<std::unique_ptr<ParameterServer>> servers_;
  std::vector<std::string> addresses_;
  std::vector<std::thread> threads_;
};

}  // namespace kolo::parallel::ps::testing
