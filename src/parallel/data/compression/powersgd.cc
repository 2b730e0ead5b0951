// PowerSGD (Vogels et al., 2019) as a Reducer communication hook: rank-r power iteration
// per matrix-shaped gradient with error feedback and warm start (kolo/parallel/compression.h).
#include <cmath>
#include <map>
#include <string>
#include <vector>

#include "kolo/autograd.h"
#include "kolo/error.h"
#include "kolo/ops.h"
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

// A rows x cols tensor holding a copy of `data` (P and Q are small: (n + m) r elements).
Tensor matrixOf(const float* data, size_t rows, size_t cols) {
  return Tensor::fromVector({static_cast<int64_t>(rows), static_cast<int64_t>(cols)},
                            std::vector<float>(data, data + rows * cols));
}

// The n x m view of a gradient in the bucket (no copy).
Tensor gradientView(const Tensor& buffer, const MatrixView& v) {
  const auto begin = static_cast<int64_t>(v.offset);
  return buffer.slice(0, begin, begin + static_cast<int64_t>(v.n * v.m))
      .view({static_cast<int64_t>(v.n), static_cast<int64_t>(v.m)});
}

// out = a b, through the tensor layer's GEMM, without recording autograd.
void productInto(const Tensor& a, const Tensor& b, float* out) {
  autograd::NoGradGuard noGrad;
  const Tensor c = matmul(a, b).contiguous();
  std::copy(c.data<float>(), c.data<float>() + c.numel(), out);
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
    // across ranks.
    std::vector<MatrixView> matrices;
    auto plain = std::make_shared<std::vector<float>>();
    std::vector<std::pair<size_t, size_t>> plainRanges;  // (offset, numel) in the bucket
    size_t pElements = 0;
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
        plain->insert(plain->end(), g + v.offset, g + v.offset + numel);
      }
    }
    std::unique_ptr<comm::Work> plainWork;
    if (!plain->empty()) {
      countBytes(plain->size() * sizeof(float));
      plainWork = bucket.comm->iallreduce(plain->data(), plain->data(), plain->size(), DType::F32,
                                          comm::ReduceOp::Sum, bucket.collective);
    }
    // P_j = M_j Q_j for every matrix, packed, then one all-reduce.
    auto p = std::make_shared<std::vector<float>>(pElements);
    size_t at = 0;
    for (const MatrixView& v : matrices) {
      std::vector<float>& q = qOf(state, bucket.index, v);
      productInto(gradientView(buffer, v), matrixOf(q.data(), v.m, v.r), p->data() + at);
      at += v.n * v.r;
    }
    std::shared_ptr<comm::Work> pWork;
    if (pElements > 0) {
      countBytes(pElements * sizeof(float));
      pWork = bucket.comm->iallreduce(p->data(), p->data(), pElements, DType::F32,
                                      comm::ReduceOp::Sum, bucket.collective);
    }
    comm::Communicator* comm = bucket.comm;
    const comm::CollectiveOptions collective = bucket.collective;
    const size_t index = bucket.index;
    return thenWork(std::move(plainWork), [this, buffer, comm, collective, index, matrices, plain,
                                           plainRanges, p, pWork]() mutable {
      finish(buffer, *comm, collective, index, matrices, *plain, plainRanges, *p, pWork.get());
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
              const std::vector<float>& plain,
              const std::vector<std::pair<size_t, size_t>>& plainRanges, std::vector<float>& p,
              comm::Work* pWork) {
    float* g = buffer.data<float>();
    BucketState& state = buckets_[index];
    const float worldSize = static_cast<float>(comm.size());
    // Uncompressed gradients: exact sums; their residual is zero.
    size_t at = 0;
    for (const auto& [offset, numel] : plainRanges) {
      std::copy(plain.begin() + static_cast<std::ptrdiff_t>(at),
                plain.begin() + static_cast<std::ptrdiff_t>(at + numel), g + offset);
      if (options_.errorFeedback)
        std::fill(state.residual.begin() + static_cast<std::ptrdiff_t>(offset),
                  state.residual.begin() + static_cast<std::ptrdiff_t>(offset + numel), 0.0f);
      at += numel;
    }
    if (matrices.empty()) return;
    pWork->wait();
    // Q_j = M_j^T P_j with P_j orthonormal, packed, all-reduced.
    size_t qElements = 0;
    for (const MatrixView& v : matrices) qElements += v.m * v.r;
    std::vector<float> q(qElements);
    size_t pAt = 0, qAt = 0;
    for (const MatrixView& v : matrices) {
      float* pj = p.data() + pAt;
      orthonormalizeColumns(pj, v.n, v.r);
      productInto(gradientView(buffer, v).t(), matrixOf(pj, v.n, v.r), q.data() + qAt);
      pAt += v.n * v.r;
      qAt += v.m * v.r;
    }
    countBytes(qElements * sizeof(float));
    comm.allreduce(q.data(), q.data(), qElements, DType::F32, comm::ReduceOp::Sum, collective);
    // The bucket gets P Q^T (the approximate sum); each rank's residual is its input minus
    // its share of that sum.
    pAt = qAt = 0;
    for (const MatrixView& v : matrices) {
      const float* pj = p.data() + pAt;
      const float* qj = q.data() + qAt;
      float* mat = g + v.offset;
      std::vector<float> approx(v.n * v.m);
      productInto(matrixOf(pj, v.n, v.r), matrixOf(qj, v.m, v.r).t(), approx.data());
      for (size_t i = 0; i < v.n * v.m; ++i) {
        if (options_.errorFeedback) state.residual[v.offset + i] = mat[i] - approx[i] / worldSize;
        mat[i] = approx[i];
      }
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
