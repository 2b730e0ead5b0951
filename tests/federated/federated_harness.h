// Shared set-up of the federated tests: the first Fashion-MNIST images, and a job whose
// server runs on the test's thread and whose client hosts run on threads, over an in-memory
// store (the same protocol the processes of `kolo run` speak over the TCP store).
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <exception>
#include <functional>
#include <memory>
#include <thread>
#include <vector>

#include "kolo/comm/stores.h"
#include "kolo/data.h"
#include "kolo/nn/models.h"
#include "kolo/parallel/federated.h"
#include "support/fashion_mnist.h"

namespace kolo::parallel::fed::testing {

/// The first `n` training samples (tests start with KOLO_SKIP_WITHOUT_FASHION_MNIST()).
inline std::shared_ptr<data::TensorDataset> firstSamples(int64_t n) {
  return std::make_shared<data::FashionMnist>(data::kFashionMnistDir, true, n);
}

inline std::shared_ptr<nn::Module> makeMlp(uint64_t seed = 7) {
  Generator generator(seed);
  return nn::makeModel("mlp", generator);
}

/// A small net for the job tests, whose cost is the protocol's rather than the training's:
/// Linear(784,32)-ReLU-Linear(32,10), 25,450 parameters.
inline std::shared_ptr<nn::Module> makeSmall(uint64_t seed = 7) {
  Generator generator(seed);
  return std::make_shared<nn::Sequential>(std::initializer_list<std::shared_ptr<nn::Module>>{
      std::make_shared<nn::Linear>(784, 32, generator), std::make_shared<nn::ReLU>(),
      std::make_shared<nn::Linear>(32, 10, generator)});
}

using ModelFactory = std::function<std::shared_ptr<nn::Module>()>;

/// Largest |a - b| / max(1, |b|) over the elements.
inline double maxRelativeError(const std::vector<float>& a, const std::vector<float>& b) {
  EXPECT_EQ(a.size(), b.size());
  double worst = 0.0;
  for (size_t i = 0; i < a.size() && i < b.size(); ++i)
    worst = std::max(worst, std::abs(double(a[i]) - b[i]) / std::max(1.0, std::abs(double(b[i]))));
  return worst;
}

/// A server and `hosts` client hosts (threads; hosts listed in `silent` never start, as if
/// their process had died before the job began).
class Job {
 public:
  Job(
      const FederatedOptions& options, std::shared_ptr<data::TensorDataset> data,
      std::vector<std::vector<int64_t>> partition, int hosts, std::vector<int> silent = {},
      const std::function<void(ClientHost&)>& configure = {},
      const ModelFactory& model = [] { return makeMlp(); })
      : store_(comm::makeMemoryStore()), server_(store_, options, flattenState(*model())) {
    for (int h = 0; h < hosts; ++h) {
      hosts_.push_back(
          std::make_unique<ClientHost>(store_, options, h, hosts, model(), data, partition));
      if (configure) configure(*hosts_.back());
      errors_.emplace_back();
    }
    for (int h = 0; h < hosts; ++h) {
      if (std::find(silent.begin(), silent.end(), h) != silent.end()) continue;
      threads_.emplace_back([this, h] {
        try {
          hosts_[h]->serve(std::chrono::seconds(60));
        } catch (...) {
          errors_[h] = std::current_exception();
        }
      });
    }
  }
  ~Job() {
    try {
      stop();
    } catch (const std::exception& e) {
      ADD_FAILURE() << "a client host failed: " << e.what();
    }
  }
  FederatedServer& server() { return server_; }
  RoundReport round() { return server_.runRound(); }
  /// Ends the job and rethrows a client host's error.
  void stop() {
    if (stopped_) return;
    stopped_ = true;
    server_.finish();
    for (auto& t : threads_) t.join();
    for (auto& e : errors_)
      if (e) std::rethrow_exception(e);
  }

 private:
  std::shared_ptr<comm::Store> store_;
  FederatedServer server_;
  std::vector<std::unique_ptr<ClientHost>> hosts_;
  std::vector<std::exception_ptr> errors_;
  std::vector<std::thread> threads_;
  bool stopped_ = false;
};

}  // namespace kolo::parallel::fed::testing
