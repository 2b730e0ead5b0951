// PowerSGD (Vogels et al., 2019) as a Reducer communication hook: rank-r power iteration
// per matrix-shaped gradient with error feedback and warm start (kolo/parallel/compression.h).
#include <cblas.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <string>
#include <vector>

#include "kolo/error.h"
#include "kolo/parallel/compression.h"

namespace kolo::parallel::compression {
namespace {

// One gradient of a bucket seen as an n x m matrix (row-major, `offset` into the bucket),
// approximated with rank r.
struct MatrixView {
  size_t slot = 0;  // position of the parameter in the bucket
  size_t offset = 0;
  size_t n = 0, m = 0, r = 0;
};

// Gram-Schmidt on the r columns of P (n x r, row-major), in double, each column projected
// off the earlier ones twice ("twice is enough" for orthogonality in floating point). A
// column that (nearly) vanishes in the projection lies in the span of the earlier ones (a
// gradient of rank below r): it is set to zero and then carries nothing, where normalising
// its rounding noise would add a direction that is not orthogonal to the others.
void orthonormalizeColumns(float* p, size_t n, size_t r) {
  std::vector<double> w(p, p + n * r);
  auto column = [&](size_t c, size_t a) -> double& { return w[a * r + c]; };
  for (size_t c = 0; c < r; ++c) {
    double before = 0.0;
    for (size_t a = 0; a < n; ++a) before += column(c, a) * column(c, a);
    for (int pass = 0; pass < 2; ++pass)
      for (size_t c2 = 0; c2 < c; ++c2) {
        double dot = 0.0;
        for (size_t a = 0; a < n; ++a) dot += column(c2, a) * column(c, a);
        for (size_t a = 0; a < n; ++a) column(c, a) -= dot * column(c2, a);
      }
    double after = 0.0;
    for (size_t a = 0; a < n; ++a) after += column(c, a) * column(c, a);
    const bool vanished = !(after > 1e-10 * before);  // |p| shrank below 1e-5 of itself
    const double scale = vanished ? 0.0 : 1.0 / std::sqrt(after);
    for (size_t a = 0; a < n; ++a) column(c, a) *= scale;
  }
  for (size_t i = 0; i < n * r; ++i) p[i] = static_cast<float>(w[i]);
}

// C (rows x cols) = alpha op(A) op(B) + beta C, row-major, single precision: the three
// products of a PowerSGD step, written straight into the bucket, the exchange buffer or the
// residual.
void gemm(bool transposeA, bool transposeB, size_t rows, size_t cols, size_t inner, float alpha,
          const float* a, const float* b, float beta, float* c) {
  const int m = static_cast<int>(rows), n = static_cast<int>(cols), k = static_cast<int>(inner);
  cblas_sgemm(CblasRowMajor, transposeA ? CblasTrans : CblasNoTrans,
              transposeB ? CblasTrans : CblasNoTrans, m, n, k, alpha, a, transposeA ? m : k, b,
              transposeB ? k : n, beta, c, n);
}

class PowerSgdHook final : public CommHook {
 public:
  explicit PowerSgdHook(PowerSgdOptions options) : options_(options) {
    KOLO_REQUIRE(options_.rank >= 1, "PowerSGD: the rank must be at least 1, got ", options_.rank);
    KOLO_REQUIRE(options_.startStep >= 0, "PowerSGD: the start step must be at least 0, got ",
                 options_.startStep);
  }
  std::string name() const override { return "powersgd:" + std::to_string(options_.rank); }

  std::unique_ptr<comm::Work> run(const GradBucket& bucket) override {
    KOLO_REQUIRE(bucket.buffer.dtype() == DType::F32, "compression hook '", name(), "': bucket ",
                 bucket.index, " holds ", dtypeName(bucket.buffer.dtype()),
                 " gradients; only f32 is compressed");
    const bool warmUp = step_ < options_.startStep;
    if (bucket.isLast()) ++step_;
    const size_t count = static_cast<size_t>(bucket.buffer.numel());
    Tensor buffer = bucket.buffer;  // a handle on the bucket's storage
    float* g = buffer.data<float>();
    if (warmUp) {  // plain all-reduce for the first steps
      countBytes(count * sizeof(float));
      return bucket.comm->iallreduce(g, g, count, DType::F32, comm::ReduceOp::Sum,
                                     bucket.collective);
    }
    BucketState& state = buckets_[bucket.index];
    if (options_.errorFeedback) {
      if (state.residual.empty()) state.residual.assign(count, 0.0f);
      KOLO_REQUIRE(state.residual.size() == count, "PowerSGD: the residual of bucket ",
                   bucket.index, " has ", state.residual.size(), " elements, the bucket ", count,
                   " (state from another model or bucket size?)");
      for (size_t i = 0; i < count; ++i) g[i] += state.residual[i];
    }

    // Which gradients are compressed: the decision depends on shapes only, so it agrees
    // across ranks. The others (vectors, small matrices) travel whole, ahead of the P's in
    // one buffer and one all-reduce.
    std::vector<MatrixView> matrices;
    std::vector<std::pair<size_t, size_t>> plainRanges;  // (offset, numel) in the bucket
    size_t plainElements = 0, pElements = 0;
    for (size_t j = 0; j < bucket.shapes.size(); ++j) {
      const Shape& shape = bucket.shapes[j];
      size_t numel = 1;
      for (int64_t d : shape) numel *= static_cast<size_t>(d);
      MatrixView v;
      v.slot = j;
      v.offset = bucket.offsets[j];
      if (shape.size() >= 2 && numel > 0) {
        v.n = static_cast<size_t>(shape[0]);
        v.m = numel / v.n;
        v.r = std::min({static_cast<size_t>(options_.rank), v.n, v.m});
      }
      const bool compress =
          v.r > 0 && static_cast<double>(v.n * v.m) >=
                         options_.minCompressionRate * static_cast<double>((v.n + v.m) * v.r);
      if (compress) {
        matrices.push_back(v);
        pElements += v.n * v.r;
      } else {
        plainRanges.emplace_back(v.offset, numel);
        plainElements += numel;
      }
    }
    std::vector<float>& exchange = state.exchange;
    exchange.resize(plainElements + pElements);
    size_t at = 0;
    for (const auto& [offset, numel] : plainRanges) {
      std::copy(g + offset, g + offset + numel, exchange.data() + at);
      at += numel;
    }
    // P_j = M_j Q_j for every matrix, after the plain values.
    for (const MatrixView& v : matrices) {
      const std::vector<float>& q = qOf(state, bucket.index, v);
      gemm(false, false, v.n, v.r, v.m, 1.0f, g + v.offset, q.data(), 0.0f, exchange.data() + at);
      at += v.n * v.r;
    }
    countBytes(exchange.size() * sizeof(float));
    std::unique_ptr<comm::Work> work = bucket.comm->iallreduce(
        exchange.data(), exchange.data(), exchange.size(), DType::F32, comm::ReduceOp::Sum,
        bucket.collective);
    comm::Communicator* comm = bucket.comm;
    const comm::CollectiveOptions collective = bucket.collective;
    const size_t index = bucket.index;
    return thenWork(std::move(work), [this, buffer, comm, collective, index, matrices,
                                      plainRanges]() mutable {
      finish(buffer, *comm, collective, index, matrices, plainRanges);
    });
  }

  NamedTensors stateDict() const override {
    NamedTensors out;
    out.emplace_back("powersgd.step", Tensor::fromVector({1}, std::vector<int64_t>{step_}));
    for (const auto& [index, state] : buckets_) {
      const std::string prefix = "powersgd.bucket" + std::to_string(index);
      if (!state.residual.empty())
        out.emplace_back(
            prefix + ".residual",
            Tensor::fromVector({static_cast<int64_t>(state.residual.size())}, state.residual));
      for (const auto& [slot, q] : state.q)
        out.emplace_back(prefix + ".q" + std::to_string(slot),
                         Tensor::fromVector({static_cast<int64_t>(q.size())}, q));
    }
    return out;
  }

  void loadStateDict(const NamedTensors& entries) override {
    int64_t step = -1;
    std::map<size_t, BucketState> buckets;
    for (const auto& [name, tensor] : entries) {
      if (name == "powersgd.step") {
        KOLO_REQUIRE(tensor.numel() == 1, "PowerSGD state: '", name, "' must hold one value");
        step = static_cast<int64_t>(tensor.toDoubleVector()[0]);
        continue;
      }
      const std::string prefix = "powersgd.bucket";
      KOLO_REQUIRE(name.rfind(prefix, 0) == 0, "PowerSGD state: unknown entry '", name, "'");
      size_t used = 0, index = 0;
      const std::string rest = name.substr(prefix.size());
      try {
        index = std::stoul(rest, &used);
      } catch (const std::exception&) {
        KOLO_THROW(InvalidArgument, "PowerSGD state: bad entry name '", name, "'");
      }
      const std::string what = rest.substr(used);
      KOLO_REQUIRE(tensor.dtype() == DType::F32, "PowerSGD state: '", name, "' is ",
                   dtypeName(tensor.dtype()), ", expected f32");
      const float* v = tensor.data<float>();
      std::vector<float> values(v, v + tensor.numel());
      if (what == ".residual") {
        buckets[index].residual = std::move(values);
      } else if (what.rfind(".q", 0) == 0 && what.size() > 2) {
        size_t slot = 0;
        try {
          slot = std::stoul(what.substr(2));
        } catch (const std::exception&) {
          KOLO_THROW(InvalidArgument, "PowerSGD state: bad entry name '", name, "'");
        }
        buckets[index].q[slot] = std::move(values);
      } else {
        KOLO_THROW(InvalidArgument, "PowerSGD state: unknown entry '", name, "'");
      }
    }
    KOLO_REQUIRE(step >= 0, "PowerSGD state: 'powersgd.step' is missing");
    step_ = step;
    buckets_ = std::move(buckets);
  }

 private:
  struct BucketState {
    std::vector<float> residual;             // error feedback, one per bucket element
    std::map<size_t, std::vector<float>> q;  // per parameter slot: Q (m x r, row-major)
    // Reused every step: the plain gradients then the P's (all-reduced together), the Q's.
    std::vector<float> exchange, qs;
  };

  // The matrix's Q: last step's (warm start) or fresh normals from a generator seeded by
  // (seed, bucket, slot), the same on every rank.
  std::vector<float>& qOf(BucketState& state, size_t index, const MatrixView& v) {
    std::vector<float>& q = state.q[v.slot];
    if (!q.empty() && options_.warmStart) {
      KOLO_REQUIRE(q.size() == v.m * v.r, "PowerSGD: Q of bucket ", index, " slot ", v.slot,
                   " has ", q.size(), " elements, expected ", v.m * v.r,
                   " (state from another model or rank?)");
      return q;
    }
    Generator gen(options_.seed * 0x9E3779B97F4A7C15ull + index * 1000003ull + v.slot + 1);
    q.resize(v.m * v.r);
    for (float& x : q) x = static_cast<float>(gen.normal());
    return q;
  }

  void finish(Tensor& buffer, comm::Communicator& comm, const comm::CollectiveOptions& collective,
              size_t index, const std::vector<MatrixView>& matrices,
              const std::vector<std::pair<size_t, size_t>>& plainRanges) {
    float* g = buffer.data<float>();
    BucketState& state = buckets_[index];
    float* exchanged = state.exchange.data();
    // Uncompressed gradients: exact sums; their residual is zero.
    size_t at = 0;
    for (const auto& [offset, numel] : plainRanges) {
      std::copy(exchanged + at, exchanged + at + numel, g + offset);
      if (options_.errorFeedback)
        std::fill(state.residual.begin() + static_cast<std::ptrdiff_t>(offset),
                  state.residual.begin() + static_cast<std::ptrdiff_t>(offset + numel), 0.0f);
      at += numel;
    }
    if (matrices.empty()) return;
    // Q_j = M_j^T P_j with P_j orthonormal, packed, all-reduced.
    size_t qElements = 0;
    for (const MatrixView& v : matrices) qElements += v.m * v.r;
    std::vector<float>& q = state.qs;
    q.resize(qElements);
    float* p = exchanged + at;
    size_t pAt = 0, qAt = 0;
    for (const MatrixView& v : matrices) {
      float* pj = p + pAt;
      orthonormalizeColumns(pj, v.n, v.r);
      gemm(true, false, v.m, v.r, v.n, 1.0f, g + v.offset, pj, 0.0f, q.data() + qAt);
      pAt += v.n * v.r;
      qAt += v.m * v.r;
    }
    countBytes(qElements * sizeof(float));
    comm.allreduce(q.data(), q.data(), qElements, DType::F32, comm::ReduceOp::Sum, collective);
    // The bucket gets P Q^T (the approximate sum); each rank's residual is its input minus
    // its share of that sum: the input copied, then -P Q^T / N added by the same product.
    const float share = -1.0f / static_cast<float>(comm.size());
    pAt = qAt = 0;
    for (const MatrixView& v : matrices) {
      const float* pj = p + pAt;
      const float* qj = q.data() + qAt;
      float* mat = g + v.offset;
      if (options_.errorFeedback) {
        float* residual = state.residual.data() + v.offset;
        std::copy(mat, mat + v.n * v.m, residual);
        gemm(false, true, v.n, v.m, v.r, share, pj, qj, 1.0f, residual);
      }
      gemm(false, true, v.n, v.m, v.r, 1.0f, pj, qj, 0.0f, mat);
      if (options_.warmStart) state.q[v.slot].assign(qj, qj + v.m * v.r);
      pAt += v.n * v.r;
      qAt += v.m * v.r;
    }
  }

  PowerSgdOptions options_;
  int64_t step_ = 0;  // passes seen (the last bucket counts them)
  std::map<size_t, BucketState> buckets_;
};

}  // namespace

std::shared_ptr<CommHook> powerSgdHook(PowerSgdOptions options) {
  return std::make_shared<PowerSgdHook>(options);
}

}  // namespace kolo::parallel::compression
