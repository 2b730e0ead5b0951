// Times one training step (zero grad + forward + cross-entropy + backward + SGD momentum
// update) of the built-in mlp, cnn and resnet at batch 128 (or --batch B) on one thread, on the
// first 1024 Fashion-MNIST training images cycled, as bench/peers/torch_single_step.py does
// in PyTorch. Prints one JSON line per model with the median step time and the median CPU
// time of a step (this thread's).
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <string>
#include <vector>

#include "kolo/data.h"
#include "kolo/nn/nn.h"
#include "kolo/threads.h"

namespace {

struct Config {
  const char* model;
  int warmup;
  int steps;
  double lr;
  int64_t batch;
};

// This thread's CPU time in ms: on a machine shared with other work, a step's CPU time
// leaves out the time it waited for a core.
double cpuMs() {
  timespec t{};
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t);
  return 1e3 * static_cast<double>(t.tv_sec) + 1e-6 * static_cast<double>(t.tv_nsec);
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

void runModel(const Config& config, const kolo::Tensor& images, const kolo::Tensor& labels) {
  using namespace kolo;
  Generator gen(0);
  auto model = nn::makeModel(config.model, gen);
  auto params = model->parameters();
  std::vector<Tensor> momentum;
  for (auto& p : params) momentum.push_back(Tensor::zeros(p.shape()));
  const float lr = static_cast<float>(config.lr);
  std::vector<double> total, fwd, bwd, opt, cpu;
  double lastLoss = 0.0;
  for (int i = 0; i < config.warmup + config.steps; ++i) {
    const int64_t b = config.batch, j = i % (images.shape()[0] / b);
    Tensor x = images.slice(0, b * j, b * (j + 1));
    Tensor y = labels.slice(0, b * j, b * (j + 1));
    const double c0 = cpuMs();
    const auto t0 = std::chrono::steady_clock::now();
    Tensor loss = crossEntropy(model->forward(x), y);
    const auto t1 = std::chrono::steady_clock::now();
    loss.backward();
    const auto t2 = std::chrono::steady_clock::now();
    {
      autograd::NoGradGuard noGrad;
      for (size_t k = 0; k < params.size(); ++k) {
        float* w = params[k].data<float>();
        float* g = params[k].grad().data<float>();
        float* b = momentum[k].data<float>();
        const int64_t n = params[k].numel();
        // torch.optim.SGD: buf = g on the first step, then 0.9 buf + g (buf starts at 0 here,
        // which gives the same first step); p -= lr buf; then zero the gradient.
        for (int64_t e = 0; e < n; ++e) {
          b[e] = 0.9f * b[e] + g[e];
          w[e] -= lr * b[e];
          g[e] = 0.0f;
        }
      }
    }
    const auto t3 = std::chrono::steady_clock::now();
    const double c3 = cpuMs();
    lastLoss = loss.item();
    if (i >= config.warmup) {
      auto ms = [](auto a, auto b) { return std::chrono::duration<double, std::milli>(b - a).count(); };
      fwd.push_back(ms(t0, t1));
      bwd.push_back(ms(t1, t2));
      opt.push_back(ms(t2, t3));
      total.push_back(ms(t0, t3));
      cpu.push_back(c3 - c0);
    }
  }
  std::printf(
      "{\"bench\": \"kolo_train_step\", \"model\": \"%s\", \"batch\": %lld, \"threads\": 1, \"warmup\": %d, "
      "\"steps\": %d, \"step_ms_median\": %.3f, \"step_ms_min\": %.3f, \"cpu_ms_median\": %.3f, \"fwd_ms_median\": %.3f, "
      "\"bwd_ms_median\": %.3f, \"opt_ms_median\": %.3f, \"final_loss\": %.4f}\n",
      config.model, static_cast<long long>(config.batch), config.warmup, config.steps, median(total), *std::min_element(total.begin(), total.end()),
      median(cpu), median(fwd), median(bwd), median(opt), lastLoss);
  std::fflush(stdout);
}

}  // namespace

int main(int argc, char** argv) {
  kolo::setNumThreads(1);
  std::vector<std::string> models;
  std::string dir = kolo::data::kFashionMnistDir;
  int64_t batch = 128;
  for (int i = 1; i < argc; ++i) {
    if (std::strcmp(argv[i], "--data") == 0 && i + 1 < argc) dir = argv[++i];
    else if (std::strcmp(argv[i], "--batch") == 0 && i + 1 < argc) batch = std::atoll(argv[++i]);
    else models.emplace_back(argv[i]);
  }
  if (models.empty()) models = {"mlp", "cnn"};
  try {
    KOLO_CHECK(batch > 0 && batch <= 1024, "train_step: --batch ", batch, " outside [1, 1024]");
    kolo::data::FashionMnist train(dir, true);
    kolo::Tensor images = train.inputs().slice(0, 0, 1024).contiguous();
    kolo::Tensor labels = train.labels().slice(0, 0, 1024).contiguous();
    for (const auto& m : models) {
      if (m == "mlp") runModel({"mlp", 30, 300, 0.05, batch}, images, labels);
      else if (m == "cnn") runModel({"cnn", 10, 40, 0.02, batch}, images, labels);
      else if (m == "resnet") runModel({"resnet", 5, 20, 0.05, batch}, images, labels);
      else KOLO_THROW(kolo::InvalidArgument, "unknown model '", m, "' (mlp, cnn, resnet)");
    }
  } catch (const kolo::Error& e) {
    std::fprintf(stderr, "train_step: %s\n", e.what());
    return 1;
  }
  return 0;
}
