// distributed_overlap: shows that the Reducer overlaps gradient all-reduce with backward.
// N ranks run as threads of this process over the native communicator (in-memory store).
// It times, per step: compute alone (forward + backward), communication alone (the same
// buckets all-reduced), both in sequence, and the Reducer's overlapped step, and prints
// one step's bucket timeline relative to the start of backward.
//   usage: distributed_overlap [--model mlp|cnn] [--ranks N] [--batch B] [--steps S]
//                              [--bucket-kb K] [--first-bucket-kb K]
#include <algorithm>
#include <barrier>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "kolo/comm/native.h"
#include "kolo/comm/stores.h"
#include "kolo/data.h"
#include "kolo/nn/models.h"
#include "kolo/ops.h"
#include "kolo/parallel/reducer.h"

extern "C" void openblas_set_num_threads(int);

using namespace kolo;
using Clock = std::chrono::steady_clock;

namespace {

double ms(Clock::duration d) { return std::chrono::duration<double, std::milli>(d).count(); }

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0.0 : v[v.size() / 2];
}

struct Options {
  std::string model = "mlp";
  int ranks = 2;
  int64_t batch = 64;  // per rank
  int steps = 30;
  size_t bucketKb = 25 * 1024;
  size_t firstBucketKb = 1024;
};

Options parse(int argc, char** argv) {
  Options o;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string k = argv[i], v = argv[i + 1];
    if (k == "--model")
      o.model = v;
    else if (k == "--ranks")
      o.ranks = std::stoi(v);
    else if (k == "--batch")
      o.batch = std::stoll(v);
    else if (k == "--steps")
      o.steps = std::stoi(v);
    else if (k == "--bucket-kb")
      o.bucketKb = std::stoul(v);
    else if (k == "--first-bucket-kb")
      o.firstBucketKb = std::stoul(v);
    else
      throw InvalidArgument("unknown option " + k);
  }
  return o;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    const Options o = parse(argc, argv);
    openblas_set_num_threads(1);
    data::FashionMnist train(data::kFashionMnistDir, true);
    auto store = comm::makeMemoryStore();
    std::barrier sync(o.ranks);
    std::vector<double> computeMs, commMs, serialMs, overlapMs;
    std::vector<std::string> timeline;
    std::vector<std::thread> threads;
    std::exception_ptr failure;
    std::mutex failureMutex;
    for (int rank = 0; rank < o.ranks; ++rank) {
      threads.emplace_back([&, rank] {
        try {
          auto comm = comm::createNativeCommunicator(store, rank, o.ranks);
          Generator gen(1);
          auto model = nn::makeModel(o.model, gen);
          parallel::ReducerOptions ro;
          ro.bucketCapBytes = o.bucketKb << 10;
          ro.firstBucketCapBytes = o.firstBucketKb << 10;
          parallel::Reducer reducer(model->namedParameters(), comm, ro);
          const int64_t lo = rank * o.batch;
          Tensor x = train.inputs().slice(0, lo, lo + o.batch).contiguous();
          Tensor y = train.labels().slice(0, lo, lo + o.batch).contiguous();
          std::vector<std::vector<float>> buffers;
          for (size_t b = 0; b < reducer.bucketCount(); ++b)
            buffers.emplace_back(reducer.bucketBytes(b) / 4, 1.0f);
          auto compute = [&] {
            model->zeroGrad();
            crossEntropy(model->forward(x), y).backward();
          };
          auto communicate = [&] {
            std::vector<std::unique_ptr<comm::Work>> works;
            for (auto& buf : buffers)
              works.push_back(comm->iallreduce(buf.data(), buf.data(), buf.size(), DType::F32,
                                               comm::ReduceOp::Sum));
            for (auto& w : works) w->wait();
          };
          std::vector<double> c, m, s, v;
          for (int step = 0; step < o.steps + 3; ++step) {
            const bool keep = step >= 3;  // warm-up
            sync.arrive_and_wait();
            auto t0 = Clock::now();
            {
              auto guard = reducer.noSync();  // hooks idle: pure compute
              compute();
            }
            auto t1 = Clock::now();
            sync.arrive_and_wait();
            auto t2 = Clock::now();
            communicate();
            auto t3 = Clock::now();
            sync.arrive_and_wait();
            auto t4 = Clock::now();
            {
              auto guard = reducer.noSync();
              compute();
            }
            communicate();
            auto t5 = Clock::now();
            sync.arrive_and_wait();
            auto t6 = Clock::now();
            model->zeroGrad();
            reducer.prepareForBackward();
            crossEntropy(model->forward(x), y).backward();
            auto backwardEnd = Clock::now();
            reducer.finalize();
            auto t7 = Clock::now();
            if (keep) {
              c.push_back(ms(t1 - t0));
              m.push_back(ms(t3 - t2));
              s.push_back(ms(t5 - t4));
              v.push_back(ms(t7 - t6));
            }
            if (rank == 0 && step == o.steps + 2) {
              const auto& t = reducer.timeline();
              char line[200];
              for (size_t b = 0; b < reducer.bucketCount(); ++b) {
                std::snprintf(line, sizeof line,
                              "  bucket %zu (%7.1f KiB): start %+8.3f ms  finish %+8.3f ms", b,
                              reducer.bucketBytes(b) / 1024.0, ms(t.bucketStart[b] - t6),
                              ms(t.bucketFinish[b] - t6));
                timeline.push_back(line);
              }
              std::snprintf(line, sizeof line,
                            "  backward returned at %+8.3f ms, finalize returned at %+8.3f ms",
                            ms(backwardEnd - t6), ms(t7 - t6));
              timeline.push_back(line);
            }
          }
          if (rank == 0) {
            computeMs = c;
            commMs = m;
            serialMs = s;
            overlapMs = v;
          }
        } catch (...) {
          std::lock_guard<std::mutex> lock(failureMutex);
          if (!failure) failure = std::current_exception();
        }
      });
    }
    for (auto& t : threads) t.join();
    if (failure) std::rethrow_exception(failure);
    const double c = median(computeMs), m = median(commMs), s = median(serialMs),
                 v = median(overlapMs);
    std::printf("model %s, %d ranks (threads), %lld samples per rank, median of %d steps\n",
                o.model.c_str(), o.ranks, static_cast<long long>(o.batch), o.steps);
    std::printf("one step (time measured from the start of forward), timeline of rank 0:\n");
    for (const auto& l : timeline) std::printf("%s\n", l.c_str());
    std::printf("compute (fwd+bwd)          %8.3f ms\n", c);
    std::printf("communication (buckets)    %8.3f ms\n", m);
    std::printf("compute + communication    %8.3f ms (sum of the two medians)\n", c + m);
    std::printf("compute then communication %8.3f ms (measured in sequence)\n", s);
    std::printf("overlapped Reducer step    %8.3f ms (%.2fx of compute-then-communication)\n", v,
                s > 0 ? v / s : 0.0);
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "distributed_overlap: %s\n", e.what());
    return 1;
  }
}
