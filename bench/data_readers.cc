// kolo's side of bench/data_readers.sh: each reader's records per second on files the script
// made. One JSON line per reader: {"reader": ..., "records": N, "seconds": S, "per_s": R}.
//   --csv FILE             readCsv, the whole table (rows)
//   --npy X Y              NpyDataset: an epoch of shuffled batches of 256 (samples)
//   --images DIR           ImageFolder with the training augmentations, through a DataLoader
//                          with a prefetch thread, 2 decoding threads, batches of 64 (images)
//   --tokens FILE          u16 token file: batches of 12 random windows of 1024 + 1 (windows)
// Each measurement is the best of --repeats runs (default 3).
#include <chrono>
#include <cstdio>
#include <cstring>
#include <functional>
#include <string>

#include "kolo/byte_corpus.h"
#include "kolo/data_files.h"
#include "kolo/image_folder.h"

using namespace kolo;

namespace {

int repeats = 3;

void report(const char* reader, int64_t records, const std::function<void()>& work) {
  double best = 1e30;
  for (int r = 0; r < repeats; ++r) {
    const auto start = std::chrono::steady_clock::now();
    work();
    best = std::min(best, std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
  }
  std::printf("{\"reader\": \"%s\", \"records\": %lld, \"seconds\": %.4f, \"per_s\": %.1f}\n", reader,
              static_cast<long long>(records), best, double(records) / best);
  std::fflush(stdout);
}

}  // namespace

int main(int argc, char** argv) {
  for (int i = 1; i < argc; ++i) {
    const std::string flag = argv[i];
    if (flag == "--repeats" && i + 1 < argc) {
      repeats = std::atoi(argv[++i]);
    } else if (flag == "--csv" && i + 1 < argc) {
      const std::string path = argv[++i];
      const int64_t rows = data::readCsv(path).inputs.size(0);
      report("csv", rows, [&] { data::readCsv(path); });
    } else if (flag == "--npy" && i + 2 < argc) {
      const std::string x = argv[++i], y = argv[++i];
      const int64_t n = data::loadNpyDataset(x, y)->size();
      report("npy", n, [&] {
        const auto dataset = data::loadNpyDataset(x, y);
        const std::vector<int64_t> order = data::epochPermutation(n, 0, 0);
        for (int64_t b = 0; b < n; b += 256)
          dataset->gather(std::vector<int64_t>(order.begin() + b, order.begin() + std::min(n, b + 256)));
      });
    } else if (flag == "--images" && i + 1 < argc) {
      const std::string root = argv[++i];
      data::ImageFolderOptions options;
      options.augment = true;
      options.mean = {0.5f, 0.5f, 0.5f};
      options.stddev = {0.25f, 0.25f, 0.25f};
      options.threads = 2;
      auto images = std::make_shared<data::ImageFolder>(root, options);
      const int64_t n = images->size();
      int64_t epoch = 0;
      report("images", n, [&] {
        data::DataLoader loader(images, std::make_shared<data::ShuffleSampler>(n, 0),
                                {.batchSize = 64, .dropLast = false, .prefetch = 2});
        loader.setState({epoch++, 0});
        data::Batch batch;
        while (loader.next(batch)) {
        }
      });
    } else if (flag == "--tokens" && i + 1 < argc) {
      const std::string path = argv[++i];
      const data::ByteCorpus corpus(path, {.type = data::TokenType::U16, .vocab = 65536}, 1024, 0.0);
      constexpr int64_t kBatches = 2000;
      report("tokens", kBatches * 12, [&] {
        for (int64_t step = 0; step < kBatches; ++step) corpus.batch(step, 12, 1);
      });
    } else {
      std::fprintf(stderr, "usage: data_readers [--repeats N] [--csv FILE] [--npy X Y] [--images DIR] [--tokens FILE]\n");
      return 2;
    }
  }
  return 0;
}
