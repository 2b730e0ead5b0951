// Times one training step of the `lm` (zero grad + forward + loss + backward + AdamW) on one
// thread in fp32 (or with bf16 products: --precision bf16), on file-order batches of a text,
// as bench/peers/torch_lm.py does in PyTorch (either architecture: --arch gpt or llama,
// --kv-heads K). Prints one JSON line with the median step time.
// Under `kolo run -n N` the ranks train it data-parallel (train::DataParallelEngine,
// multi-worker-mirrored: bucketed all-reduce overlapped with backward), each on its rows of the
// same global batch, as the twin does under DDP (`--ranks N`); rank 0 prints the line.
// bench/lm_vs_torch.sh runs both.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "kolo/byte_corpus.h"
#include "kolo/comm/init.h"
#include "kolo/memory.h"
#include "kolo/nn/language_model.h"
#include "kolo/optim.h"
#include "kolo/precision.h"
#include "kolo/parallel/distributed.h"
#include "kolo/threads.h"
#include "kolo/train/engine.h"

namespace {

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

}  // namespace

int main(int argc, char** argv) {
  using namespace kolo;
  setNumThreads(1);
  // As train::fit does: keep freed activations in the heap rather than page-faulting fresh
  // mmap()s in every step.
  keepFreedMemory();
  nn::LanguageModelConfig config;
  int64_t batch = 16, warmup = 3, steps = 20;
  std::string text = "/usr/share/common-licenses/GPL-3", precision = "f32";
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string flag = argv[i];
    const int64_t value = std::atoll(argv[i + 1]);
    if (flag == "--layers") config.layers = value;
    else if (flag == "--d-model") config.dModel = value;
    else if (flag == "--heads") config.heads = value;
    else if (flag == "--seq-len") config.seqLen = value;
    else if (flag == "--batch") batch = value;
    else if (flag == "--warmup") warmup = value;
    else if (flag == "--steps") steps = value;
    else if (flag == "--data") text = argv[i + 1];
    else if (flag == "--precision") precision = argv[i + 1];
    else if (flag == "--arch") config.arch = nn::parseLanguageModelArch(argv[i + 1]);
    else if (flag == "--kv-heads") config.kvHeads = value;
    else {
      std::fprintf(stderr, "lm_step: unknown flag %s\n", argv[i]);
      return 2;
    }
  }
  try {
    MatmulPrecisionGuard products(parseMatmulPrecision(precision));
    const bool distributed = comm::detectLaunch().size > 1;
    train::DataParallelOptions options;
    if (distributed) {
      options.strategy.kind = parallel::StrategyKind::MultiWorkerMirrored;
      options.strategy.communicator = parallel::init();
    }
    options.loss = [](nn::Module& m, const Tensor& x, const Tensor& y) {
      return nn::languageModelLoss(m.forward(x), y);
    };
    auto build = [&config] {
      Generator gen(0);
      return nn::makeLanguageModel(config, gen);
    };
    auto adamw = [](const optim::NamedParameters& p) {
      return optim::makeAdamW(p, {.lr = 1e-3, .weightDecay = 0.01});
    };
    train::DataParallelEngine engine(build, adamw, options);
    const int rank = engine.dataShard().rank, ranks = engine.dataShard().worldSize;
    int64_t parameters = 0;
    for (const auto& p : engine.model().parameters()) parameters += p.numel();
    const data::ByteCorpus corpus(text, config.seqLen);
    std::vector<double> total;
    double lastLoss = 0.0;
    for (int64_t step = 0; step < warmup + steps; ++step) {
      const data::Batch whole = corpus.fileOrderBatch(step, batch);
      const int64_t rows = batch / ranks;  // this rank's rows of the global batch
      const data::Batch b{whole.inputs.slice(0, rank * rows, (rank + 1) * rows).contiguous(),
                          whole.labels.slice(0, rank * rows, (rank + 1) * rows).contiguous(), {}};
      const auto t0 = std::chrono::steady_clock::now();
      lastLoss = engine.step(b, 1e-3);
      const auto t1 = std::chrono::steady_clock::now();
      if (step >= warmup) total.push_back(std::chrono::duration<double, std::milli>(t1 - t0).count());
    }
    if (rank != 0) return 0;
    std::printf(
        "{\"bench\": \"kolo_lm_step\", \"ranks\": %d, \"precision\": \"%s\", \"arch\": \"%s\", \"layers\": %lld, \"d_model\": %lld, \"heads\": %lld, \"seq_len\": %lld, "
        "\"batch\": %lld, \"parameters\": %lld, \"steps\": %lld, \"step_ms_median\": %.3f, \"step_ms_min\": %.3f, "
        "\"final_loss\": %.4f}\n",
        ranks, precision.c_str(), nn::languageModelArchName(config.arch), static_cast<long long>(config.layers), static_cast<long long>(config.dModel),
        static_cast<long long>(config.heads), static_cast<long long>(config.seqLen), static_cast<long long>(batch),
        static_cast<long long>(parameters), static_cast<long long>(steps), median(total),
        *std::min_element(total.begin(), total.end()), lastLoss);
  } catch (const Error& e) {
    std::fprintf(stderr, "lm_step: %s\n", e.what());
    return 1;
  }
  return 0;
}
