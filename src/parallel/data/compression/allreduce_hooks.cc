// The lossless all-reduce hook and the fp16/bf16 cast hooks (kolo/parallel/compression.h).
#include <cmath>
#include <cstring>
#include <vector>

#include "kolo/error.h"
#include "kolo/parallel/compression.h"
#include "parallel/half_pack.h"

namespace kolo::parallel::compression {
namespace {

// out[i] = bf16(in[i] * scale) and back, as floatToBFloat16 / bfloat16ToFloat but inline, so
// that the loops vectorise (fp16: parallel/half_pack.h).
void toBFloat16(const float* in, uint16_t* out, size_t n, float scale) {
  for (size_t i = 0; i < n; ++i) {
    const float v = in[i] * scale;
    uint32_t x;
    std::memcpy(&x, &v, sizeof x);
    const bool nan = (x & 0x7fffffffu) > 0x7f800000u;
    const uint32_t rounded = (x + 0x7fffu + ((x >> 16) & 1u)) >> 16;
    out[i] = static_cast<uint16_t>(nan ? ((x >> 16) | 0x40u) : rounded);
  }
}

void fromBFloat16(const uint16_t* in, float* out, size_t n, float scale) {
  for (size_t i = 0; i < n; ++i) {
    const uint32_t x = static_cast<uint32_t>(in[i]) << 16;
    float v;
    std::memcpy(&v, &x, sizeof v);
    out[i] = v * scale;
  }
}

class AllreduceHook final : public CommHook {
 public:
  std::string name() const override { return "allreduce"; }
  std::unique_ptr<comm::Work> run(const GradBucket& bucket) override {
    const size_t count = static_cast<size_t>(bucket.buffer.numel());
    countBytes(count * dtypeSize(bucket.buffer.dtype()));
    Tensor buffer = bucket.buffer;  // a handle on the bucket's storage
    void* data = buffer.rawData();
    return bucket.comm->iallreduce(data, data, count, bucket.buffer.dtype(), comm::ReduceOp::Sum,
                                   bucket.collective);
  }
};

class CastHook final : public CommHook {
 public:
  explicit CastHook(DType wire) : wire_(wire) {
    KOLO_CHECK(wire == DType::F16 || wire == DType::BF16,
               "castHook: the wire dtype must be f16 or bf16, got ", dtypeName(wire));
  }
  std::string name() const override { return wire_ == DType::F16 ? "fp16" : "bf16"; }

  std::unique_ptr<comm::Work> run(const GradBucket& bucket) override {
    KOLO_CHECK(bucket.buffer.dtype() == DType::F32, "compression hook '", name(), "': bucket ",
               bucket.index, " holds ", dtypeName(bucket.buffer.dtype()),
               " gradients; only f32 is compressed");
    const size_t n = static_cast<size_t>(bucket.buffer.numel());
    const int size = bucket.comm->size();
    // Divide before the cast: the sum of `size` values each below the 16-bit maximum may
    // exceed it, their average does not.
    const float down = 1.0f / static_cast<float>(size);
    auto wireBuffer = std::make_shared<std::vector<uint16_t>>(n);
    const float* in = bucket.buffer.data<float>();
    uint16_t* w = wireBuffer->data();
    if (wire_ == DType::F16)
      parallel::detail::floatsToHalf(in, w, n, down);
    else
      toBFloat16(in, w, n, down);
    countBytes(n * sizeof(uint16_t));
    auto first = bucket.comm->iallreduce(w, w, n, wire_, comm::ReduceOp::Sum, bucket.collective);
    Tensor out = bucket.buffer;
    const DType wire = wire_;
    return thenWork(std::move(first), [out, wireBuffer, wire, n, size]() mutable {
      float* o = out.data<float>();
      const uint16_t* v = wireBuffer->data();
      const float up = static_cast<float>(size);
      if (wire == DType::F16)
        parallel::detail::halvesToFloat(v, o, n, up);
      else
        fromBFloat16(v, o, n, up);
    });
  }

 private:
  DType wire_;
};

}  // namespace

std::shared_ptr<CommHook> allreduceHook() { return std::make_shared<AllreduceHook>(); }

std::shared_ptr<CommHook> castHook(DType wire) { return std::make_shared<CastHook>(wire); }

}  // namespace kolo::parallel::compression
