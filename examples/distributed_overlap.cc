// distributed_overlap: shows that the Reducer overlaps gradient all-reduce with backward.
// N ranks run as threads of this process over the native communicator (in-memory store),
// or, started by a launcher (kolo run -n N -- distributed_overlap ...), one rank per process.
// It times, per step: compute alone (forward + backward), communication alone (the same
// buckets all-reduced), both in sequence, and the Reducer's overlapped step, and prints
// one step's bucket timeline relative to the start of backward.
//   usage: distributed_overlap [--model mlp|cnn] [--ranks N] [--batch B] [--steps S]
//                              [--bucket-kb K] [--first-bucket-kb K] [--overlap 1|0]
#include <algorithm>
#include <barrier>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "kolo/comm/native.h"
#include "kolo/comm/stores.h"
#include "kolo/data.h"
#include "kolo/nn/models.h"
#include "kolo/ops.h"
#include "kolo/parallel/distributed.h"
#include "kolo/parallel/reducer.h"
#include "kolo/threads.h"

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
  bool overlap = true;
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
    else if (k == "--overlap")
      o.overlap = v != "0";
    else if (k == "--first-bucket-kb")
      o.firstBucketKb = std::stoul(v);
    else
      throw InvalidArgument("unknown option " + k);
  }
  return o;
}

struct Measurements {
  std::vector<double> computeMs, commMs, serialMs, overlapMs, reducerBackwardMs;
  std::vector<std::string> timeline;
};

// One rank's measurements; `sync` aligns the ranks before each phase. Rank 0 fills `out`.
void measureRank(std::shared_ptr<comm::Communicator> comm, const std::function<void()>& sync,
                 const Options& o, const data::TensorDataset& train, Measurements& out) {
  const int rank = comm->rank();
  Generator gen(1);
  auto model = nn::makeModel(o.model, gen);
  parallel::ReducerOptions ro;
  ro.bucketCapBytes = o.bucketKb << 10;
  ro.firstBucketCapBytes = o.firstBucketKb << 10;
  ro.overlap = o.overlap;
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
      works.push_back(
          comm->iallreduce(buf.data(), buf.data(), buf.size(), DType::F32, comm::ReduceOp::Sum));
    for (auto& w : works) w->wait();
  };
  std::vector<double> c, m, s, v, bw;
  for (int step = 0; step < o.steps + 3; ++step) {
    const bool keep = step >= 3;  // warm-up
    sync();
    auto t0 = Clock::now();
    {
      auto guard = reducer.noSync();  // hooks idle: pure compute
      compute();
    }
    auto t1 = Clock::now();
    sync();
    auto t2 = Clock::now();
    communicate();
    auto t3 = Clock::now();
    sync();
    auto t4 = Clock::now();
    {
      auto guard = reducer.noSync();
      compute();
    }
    communicate();
    auto t5 = Clock::now();
    sync();
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
      bw.push_back(ms(backwardEnd - t6));
    }
    if (rank == 0 && step == o.steps + 2) {
      const auto& t = reducer.timeline();
      char line[200];
      for (size_t b = 0; b < reducer.bucketCount(); ++b) {
        std::snprintf(
            line, sizeof line, "  bucket %zu (%7.1f KiB): start %+8.3f ms  finish %+8.3f ms", b,
            reducer.bucketBytes(b) / 1024.0, ms(t.bucketStart[b] - t6), ms(t.bucketFinish[b] - t6));
        out.timeline.push_back(line);
      }
      std::snprintf(line, sizeof line,
                    "  backward returned at %+8.3f ms, finalize returned at %+8.3f ms",
                    ms(backwardEnd - t6), ms(t7 - t6));
      out.timeline.push_back(line);
    }
  }
  if (rank == 0) {
    out.computeMs = c;
    out.commMs = m;
    out.serialMs = s;
    out.overlapMs = v;
    out.reducerBackwardMs = bw;
  }
}

void report(const Options& o, int ranks, const char* how, const Measurements& r) {
  const double c = median(r.computeMs), m = median(r.commMs), s = median(r.serialMs),
               v = median(r.overlapMs);
  std::printf("model %s, %d ranks (%s), %lld samples per rank, median of %d steps\n",
              o.model.c_str(), ranks, how, static_cast<long long>(o.batch), o.steps);
  std::printf("one step (time measured from the start of forward), timeline of rank 0:\n");
  for (const auto& l : r.timeline) std::printf("%s\n", l.c_str());
  std::printf("compute (fwd+bwd)          %8.3f ms\n", c);
  std::printf("communication (buckets)    %8.3f ms\n", m);
  std::printf("compute + communication    %8.3f ms (sum of the two medians)\n", c + m);
  std::printf("compute then communication %8.3f ms (measured in sequence)\n", s);
  std::printf("  of which fwd+bwd          %8.3f ms (with buckets in flight when overlapping)\n",
              median(r.reducerBackwardMs));
  std::printf("Reducer step, overlap %-3s  %8.3f ms (%.2fx of compute-then-communication)\n",
              o.overlap ? "on" : "off", v, s > 0 ? v / s : 0.0);
}

}  // namespace

int main(int argc, char** argv) {
  try {
    const Options o = parse(argc, argv);
    setNumThreads(1);
    data::FashionMnist train(data::kFashionMnistDir, true);
    Measurements results;
    // Under a launcher (kolo run, mpirun, torchrun) each process is one rank.
    auto job = parallel::init();
    if (job->size() > 1) {
      measureRank(
          job, [&] { job->barrier(); }, o, train, results);
      if (job->rank() == 0) report(o, job->size(), "processes", results);
      return 0;
    }
    auto store = comm::makeMemoryStore();
    std::barrier barrier(o.ranks);
    std::vector<std::thread> threads;
    std::exception_ptr failure;
    std::mutex failureMutex;
    for (int rank = 0; rank < o.ranks; ++rank) {
      threads.emplace_back([&, rank] {
        try {
          auto comm = comm::createNativeCommunicator(store, rank, o.ranks);
          measureRank(
              comm, [&] { barrier.arrive_and_wait(); }, o, train, results);
        } catch (...) {
          std::lock_guard<std::mutex> lock(failureMutex);
          if (!failure) failure = std::current_exception();
        }
      });
    }
    for (auto& t : threads) t.join();
    if (failure) std::rethrow_exception(failure);
    report(o, o.ranks, "threads", results);
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "distributed_overlap: %s\n", e.what());
    return 1;
  }
}
