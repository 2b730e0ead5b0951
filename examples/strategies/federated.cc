// run: kolo run -n 3 -- ./federated --steps 10 --compare
// Federated averaging (FedAvg) for a model of your own: a two-layer GELU MLP defined here,
// trained on Fashion-MNIST (or synthetic data when the dataset is not installed) split IID
// over 20 simulated clients. Rank 0 is the server (parallel::fed::FederatedServer), the other
// ranks host the clients (parallel::fed::ClientHost), over kolo run's store; each round (a
// --steps is a round) 5 sampled clients train one local epoch of SGD on their own samples,
// and the server applies the sample-weighted mean of their updates. Federated training is
// not one device's math (the clients drift apart within a round), so --compare trains the
// same model on one device, on the same training set, with as many sequential SGD steps as
// a client takes in all the rounds, each over as many samples as the round's clients take
// in one local step (so it visits as many samples as the clients did in all), and its last
// line is `accuracy A vs one device B` (test accuracy). Options:
// --steps ROUNDS (default 20), --lr LR (default 0.05), --data DIR, --compare. Exit status 1
// when A is more than 0.1 below B, or not above twice chance (0.2: it learned nothing), or
// on an error.
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>

#include "kolo/comm/init.h"
#include "kolo/comm/stores.h"
#include "example_data.h"
#include "kolo/data.h"
#include "kolo/error.h"
#include "kolo/nn/layers.h"
#include "kolo/ops.h"
#include "kolo/optim.h"
#include "kolo/parallel/federated.h"
#include "kolo/threads.h"
#include "kolo/train/evaluate.h"
#include "kolo/train/fit.h"

namespace {

namespace fed = kolo::parallel::fed;

constexpr int kClients = 20, kClientsPerRound = 5;
constexpr int64_t kLocalBatch = 20;

// 784 -> 128 -> 64 -> 10 with GELU between.
struct GeluMlp : kolo::nn::Module {
  explicit GeluMlp(kolo::Generator& gen) {
    hidden1 = registerModule("hidden1", std::make_shared<kolo::nn::Linear>(784, 128, gen));
    hidden2 = registerModule("hidden2", std::make_shared<kolo::nn::Linear>(128, 64, gen));
    out = registerModule("out", std::make_shared<kolo::nn::Linear>(64, 10, gen));
  }
  kolo::Tensor forward(const kolo::Tensor& x) override {  // x: (B, 784)
    return (*out)(kolo::gelu((*hidden2)(kolo::gelu((*hidden1)(x)))));  // (B, 10)
  }
  std::shared_ptr<kolo::nn::Linear> hidden1, hidden2, out;
};

std::shared_ptr<kolo::nn::Module> makeModel() {
  kolo::Generator gen(1);  // the server and every client start alike
  return std::make_shared<GeluMlp>(gen);
}

fed::FederatedOptions federatedOptions(int64_t rounds, double lr) {
  fed::FederatedOptions options;
  options.clients = kClients;
  options.clientsPerRound = kClientsPerRound;
  options.rounds = rounds;
  options.client.localEpochs = 1;
  options.client.localBatch = kLocalBatch;
  options.client.lr = lr;
  options.roundTimeout = std::chrono::seconds(60);
  options.seed = 1;
  return options;
}

// The test accuracy of one device trained with plain SGD for `steps` steps of `batch`
// samples over the whole training set.
double oneDeviceAccuracy(std::shared_ptr<kolo::data::TensorDataset> train,
                         std::shared_ptr<kolo::data::TensorDataset> test, int64_t steps,
                         int64_t batch, double lr) {
  kolo::train::DataParallelEngine engine(
      makeModel,
      [lr](const kolo::parallel::NamedTensors& parameters) {
        return std::make_unique<kolo::optim::Sgd>(parameters, kolo::optim::SgdOptions{.lr = lr});
      },
      {});
  kolo::observe::Logger quietLogger(stderr, kolo::observe::LogLevel::Warn);
  kolo::train::FitOptions options;
  options.steps = steps;
  options.batch = batch;
  options.seed = 1;
  options.quiet = true;
  options.logger = &quietLogger;
  return kolo::train::fit(engine, train, test, options).validationAccuracy;
}

}  // namespace

int main(int argc, char** argv) try {
  int64_t rounds = 20;
  double lr = 0.05;
  bool compare = false;
  std::string dataDir = kolo::data::kFashionMnistDir;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    const bool hasValue = i + 1 < argc;
    if (arg == "--steps" && hasValue) rounds = std::atoll(argv[++i]);
    else if (arg == "--lr" && hasValue) lr = std::atof(argv[++i]);
    else if (arg == "--data" && hasValue) dataDir = argv[++i];
    else if (arg == "--compare") compare = true;
    else KOLO_THROW(kolo::InvalidArgument, "unknown argument '", arg, "'");
  }
  // [federated] The server and the client hosts meet in kolo run's store.
  const kolo::comm::LaunchInfo launch = kolo::comm::detectLaunch();
  KOLO_REQUIRE(launch.launcher == "kolo" && launch.size >= 2,
               "start it under kolo run with at least 2 ranks (kolo run -n 3 -- ./federated)");
  kolo::setNumThreads(1);
  auto store = kolo::comm::prefixStore(
      kolo::comm::connectTcpStore(launch.storeAddress, launch.token, std::chrono::minutes(5)),
      "federated-example/");
  const fed::FederatedOptions options = federatedOptions(rounds, lr);
  const auto train = loadSplit(dataDir, true, 6000, 2000);
  const int hosts = launch.size - 1;

  if (launch.rank > 0) {
    // [federated] A client host: clients c with c % hosts == rank - 1, each on its own part
    // of the training set (the same seeded IID split on every host).
    auto partition = fed::partitionClients(train->labels(), kClients, fed::parsePartition("iid"), options.seed);
    fed::ClientHost host(store, options, launch.rank - 1, hosts, makeModel(), train, std::move(partition));
    host.serve(options.roundTimeout * 5 + std::chrono::minutes(5));
    return 0;
  }
  // [federated] The server: rounds of sampled clients, their updates averaged.
  const auto test = loadSplit(dataDir, false, 6000, 2000);
  std::shared_ptr<kolo::nn::Module> model = makeModel();
  fed::FederatedServer server(store, options, fed::flattenState(*model));
  KOLO_REQUIRE(server.awaitHosts(hosts, std::chrono::minutes(5)) == hosts,
               "not every client host said it was ready");
  double accuracy = 0.0;
  for (int64_t round = 0; round < rounds; ++round) {
    const fed::RoundReport report = server.runRound();
    fed::loadState(*model, server.weights());
    accuracy = kolo::train::evaluate(*model, *test).accuracy;
    std::printf("round %lld: %d client(s), test accuracy %.4f\n", static_cast<long long>(report.round),
                report.clients, accuracy);
  }
  server.finish();
  if (!compare) return 0;

  // Every client holds size / kClients samples and visits each once per local epoch.
  const int64_t localSteps = options.client.localEpochs * (train->size() / kClients) / kLocalBatch;
  const double oneDevice =
      oneDeviceAccuracy(train, test, rounds * localSteps, kClientsPerRound * kLocalBatch, lr);
  std::printf("accuracy %.4f vs one device %.4f\n", accuracy, oneDevice);
  return accuracy >= oneDevice - 0.1 && accuracy > 0.2 ? 0 : 1;
} catch (const kolo::Error& e) {
  std::fprintf(stderr, "federated: %s\n", e.what());
  return 1;
}
