// Reduction kernels against a scalar reference for every dtype and op: random data,
// odd lengths and unaligned pointers (to hit vector tails), aliasing forms, integer
// wrap-around, half-precision rounding, NaN handling of min/max, and the average finish.
#include "comm/algorithms/reduce_kernels.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

#include "comm/closed_form.h"
#include "comm_algorithms/values.h"
#include "kolo/error.h"

namespace kolo::comm::detail {
namespace {

using testing::firstDifference;

template <class T>
T refOp(T a, T b, ReduceOp op) {
  switch (op) {
    case ReduceOp::Sum:
    case ReduceOp::Avg: return a + b;
    case ReduceOp::Prod: return a * b;
    case ReduceOp::Min: return b < a ? b : a;
    case ReduceOp::Max: return a < b ? b : a;
  }
  return a;
}

template <class U>
U wrapOp(U a, U b, ReduceOp op) {  // unsigned arithmetic: the wrap the kernels promise
  switch (op) {
    case ReduceOp::Sum:
    case ReduceOp::Avg: return static_cast<U>(a + b);
    case ReduceOp::Prod: return static_cast<U>(a * b);
    default: return a;
  }
}

// One element of the scalar reference: out = a op b.
void refElement(DType dtype, void* out, const void* a, const void* b, size_t i, ReduceOp op) {
  switch (dtype) {
    case DType::F32:
      static_cast<float*>(out)[i] = refOp(static_cast<const float*>(a)[i], static_cast<const float*>(b)[i], op);
      return;
    case DType::F64:
      static_cast<double*>(out)[i] = refOp(static_cast<const double*>(a)[i], static_cast<const double*>(b)[i], op);
      return;
    case DType::F16: {
      const float x = halfToFloat(static_cast<const uint16_t*>(a)[i]);
      const float y = halfToFloat(static_cast<const uint16_t*>(b)[i]);
      static_cast<uint16_t*>(out)[i] = floatToHalf(refOp(x, y, op));
      return;
    }
    case DType::BF16: {
      const float x = bfloat16ToFloat(static_cast<const uint16_t*>(a)[i]);
      const float y = bfloat16ToFloat(static_cast<const uint16_t*>(b)[i]);
      static_cast<uint16_t*>(out)[i] = floatToBFloat16(refOp(x, y, op));
      return;
    }
    case DType::I32: {
      const int32_t x = static_cast<const int32_t*>(a)[i], y = static_cast<const int32_t*>(b)[i];
      static_cast<int32_t*>(out)[i] =
          (op == ReduceOp::Min || op == ReduceOp::Max)
              ? refOp(x, y, op)
              : static_cast<int32_t>(wrapOp(static_cast<uint32_t>(x), static_cast<uint32_t>(y), op));
      return;
    }
    case DType::I64: {
      const int64_t x = static_cast<const int64_t*>(a)[i], y = static_cast<const int64_t*>(b)[i];
      static_cast<int64_t*>(out)[i] =
          (op == ReduceOp::Min || op == ReduceOp::Max)
              ? refOp(x, y, op)
              : static_cast<int64_t>(wrapOp(static_cast<uint64_t>(x), static_cast<uint64_t>(y), op));
      return;
    }
    case DType::U8: {
      const uint8_t x = static_cast<const uint8_t*>(a)[i], y = static_cast<const uint8_t*>(b)[i];
      static_cast<uint8_t*>(out)[i] = (op == ReduceOp::Min || op == ReduceOp::Max) ? refOp(x, y, op) : wrapOp(x, y, op);
      return;
    }
  }
}

std::vector<char> randomBuffer(DType dtype, size_t count, std::mt19937_64& rng) {
  std::vector<char> out(count * dtypeSize(dtype) + 16);
  std::uniform_real_distribution<double> real(-100.0, 100.0);
  for (size_t i = 0; i < count; ++i) {
    switch (dtype) {
      case DType::F32: static_cast<float*>(static_cast<void*>(out.data()))[i] = static_cast<float>(real(rng)); break;
      case DType::F64: reinterpret_cast<double*>(out.data())[i] = real(rng); break;
      case DType::F16:
      case DType::BF16: storeElement(dtype, out.data(), i, real(rng)); break;
      case DType::I32: reinterpret_cast<int32_t*>(out.data())[i] = static_cast<int32_t>(rng()); break;
      case DType::I64: reinterpret_cast<int64_t*>(out.data())[i] = static_cast<int64_t>(rng()); break;
      case DType::U8: reinterpret_cast<uint8_t*>(out.data())[i] = static_cast<uint8_t>(rng()); break;
    }
  }
  return out;
}

TEST(ReduceKernels, MatchScalarReferenceForEveryDtypeOpAndLength) {
  std::mt19937_64 rng(12345);
  for (DType dtype : kAllDTypes) {
    const size_t esize = dtypeSize(dtype);
    for (ReduceOp op : kAllReduceOps) {
      for (size_t count : {size_t{1}, size_t{3}, size_t{17}, size_t{255}, size_t{257}, size_t{1000}, size_t{4099}}) {
        // Unaligned by one element, and lengths that leave vector tails.
        const std::vector<char> a = randomBuffer(dtype, count + 1, rng);
        const std::vector<char> b = randomBuffer(dtype, count + 1, rng);
        std::vector<char> want(a.size());
        for (size_t i = 0; i < count; ++i) refElement(dtype, want.data(), a.data() + esize, b.data() + esize, i, op);

        std::vector<char> out(a.size());
        reduceTo(out.data() + esize, a.data() + esize, b.data() + esize, count, dtype, op);
        EXPECT_EQ(firstDifference(dtype, out.data() + esize, want.data(), count), "")
            << "reduceTo " << reduceOpName(op) << " count " << count;

        std::vector<char> portable(a.size());
        reduceToPortable(portable.data() + esize, a.data() + esize, b.data() + esize, count, dtype, op);
        EXPECT_EQ(firstDifference(dtype, portable.data() + esize, want.data(), count), "")
            << "portable path " << reduceOpName(op) << " count " << count;

        std::vector<char> acc = a;
        reduceInto(acc.data() + esize, b.data() + esize, count, dtype, op);
        EXPECT_EQ(firstDifference(dtype, acc.data() + esize, want.data(), count), "")
            << "reduceInto " << reduceOpName(op) << " count " << count;

        std::vector<char> aliasB = b;  // out == b
        reduceTo(aliasB.data() + esize, a.data() + esize, aliasB.data() + esize, count, dtype, op);
        EXPECT_EQ(firstDifference(dtype, aliasB.data() + esize, want.data(), count), "")
            << "reduceTo out==b " << reduceOpName(op) << " count " << count;
      }
    }
  }
}

TEST(ReduceKernels, HalfTypesMatchReferenceOnEveryBitPattern) {
  // Random 16-bit patterns cover subnormals, infinities, NaNs and rounding ties. NaN
  // payloads may differ between the F16C and the scalar conversion, so NaN matches NaN.
  std::mt19937_64 rng(777);
  const size_t count = 1 << 16;
  for (DType dtype : {DType::F16, DType::BF16}) {
    auto toFloat = [dtype](uint16_t v) { return dtype == DType::F16 ? halfToFloat(v) : bfloat16ToFloat(v); };
    std::vector<uint16_t> a(count), b(count), want(count), got(count), portable(count);
    for (size_t i = 0; i < count; ++i) {
      a[i] = static_cast<uint16_t>(i);  // every pattern once
      b[i] = static_cast<uint16_t>(rng());
    }
    for (ReduceOp op : kAllReduceOps) {
      for (size_t i = 0; i < count; ++i) refElement(dtype, want.data(), a.data(), b.data(), i, op);
      reduceTo(got.data(), a.data(), b.data(), count, dtype, op);
      reduceToPortable(portable.data(), a.data(), b.data(), count, dtype, op);
      size_t bad = 0;
      for (size_t i = 0; i < count; ++i) {
        const float w = toFloat(want[i]);
        for (uint16_t g : {got[i], portable[i]}) {
          const bool same = std::isnan(w) ? std::isnan(toFloat(g)) : g == want[i];
          if (!same && bad++ < 3)
            ADD_FAILURE() << dtypeName(dtype) << " " << reduceOpName(op) << " a=" << a[i] << " b=" << b[i]
                          << " got bits " << g << " want " << want[i];
        }
      }
      EXPECT_EQ(bad, 0u) << dtypeName(dtype) << " " << reduceOpName(op);
    }
  }
}

TEST(ReduceKernels, CountZeroTouchesNothing) {
  float x = 1.0f;
  reduceInto(&x, nullptr, 0, DType::F32, ReduceOp::Sum);
  reduceTo(&x, nullptr, nullptr, 0, DType::F32, ReduceOp::Sum);
  finishAvg(nullptr, 0, DType::F32, 3);
  EXPECT_EQ(x, 1.0f);
}

TEST(ReduceKernels, IntegersWrapAround) {
  int32_t a[2] = {std::numeric_limits<int32_t>::max(), -2};
  const int32_t b[2] = {1, std::numeric_limits<int32_t>::min()};
  reduceInto(a, b, 2, DType::I32, ReduceOp::Sum);
  EXPECT_EQ(a[0], std::numeric_limits<int32_t>::min());
  EXPECT_EQ(a[1], std::numeric_limits<int32_t>::max() - 1);
  uint8_t u[2] = {200, 16};
  const uint8_t v[2] = {100, 16};
  reduceInto(u, v, 2, DType::U8, ReduceOp::Sum);
  EXPECT_EQ(u[0], 44);
  reduceInto(u + 1, v + 1, 1, DType::U8, ReduceOp::Prod);  // 32 * 16 = 512 = 0 mod 256
  EXPECT_EQ(u[1], 0);
}

TEST(ReduceKernels, HalfSumsRoundToNearestEven) {
  // f16: 2048 + 1 is a tie between 2048 and 2050 -> even mantissa 2048; 2048 + 3 -> 2052.
  uint16_t a[2] = {floatToHalf(2048.0f), floatToHalf(2048.0f)};
  const uint16_t b[2] = {floatToHalf(1.0f), floatToHalf(3.0f)};
  reduceInto(a, b, 2, DType::F16, ReduceOp::Sum);
  EXPECT_EQ(halfToFloat(a[0]), 2048.0f);
  EXPECT_EQ(halfToFloat(a[1]), 2052.0f);
  // bf16 keeps 8 significant bits: 256 + 1 ties to 256, 256 + 3 rounds to 260.
  uint16_t c[2] = {floatToBFloat16(256.0f), floatToBFloat16(256.0f)};
  const uint16_t d[2] = {floatToBFloat16(1.0f), floatToBFloat16(3.0f)};
  reduceInto(c, d, 2, DType::BF16, ReduceOp::Sum);
  EXPECT_EQ(bfloat16ToFloat(c[0]), 256.0f);
  EXPECT_EQ(bfloat16ToFloat(c[1]), 260.0f);
}

TEST(ReduceKernels, MinMaxKeepAccumulatedNaNAndIgnoreIncomingNaN) {
  const float nan = std::numeric_limits<float>::quiet_NaN();
  float acc[2] = {nan, 1.0f};
  const float in[2] = {5.0f, nan};
  reduceInto(acc, in, 2, DType::F32, ReduceOp::Max);
  EXPECT_TRUE(std::isnan(acc[0]));
  EXPECT_EQ(acc[1], 1.0f);
}

TEST(ReduceKernels, FinishAvgDividesInTheElementType) {
  float f[3] = {3.0f, 1.0f, -7.0f};
  finishAvg(f, 3, DType::F32, 3);
  EXPECT_EQ(f[0], 1.0f);
  EXPECT_EQ(f[1], 1.0f / 3.0f);
  EXPECT_EQ(f[2], -7.0f / 3.0f);
  int32_t i[2] = {7, -7};
  finishAvg(i, 2, DType::I32, 2);  // truncation toward zero
  EXPECT_EQ(i[0], 3);
  EXPECT_EQ(i[1], -3);
  uint8_t u = 255;
  finishAvg(&u, 1, DType::U8, 4);
  EXPECT_EQ(u, 63);
  uint16_t h = floatToHalf(1.0f);
  finishAvg(&h, 1, DType::F16, 3);
  EXPECT_EQ(h, floatToHalf(1.0f / 3.0f));
  uint16_t bf = floatToBFloat16(10.0f);
  finishAvg(&bf, 1, DType::BF16, 3);
  EXPECT_EQ(bf, floatToBFloat16(10.0f / 3.0f));
  double d = 1.0;
  finishReduction(&d, 1, DType::F64, ReduceOp::Sum, 4);  // not Avg: unchanged
  EXPECT_EQ(d, 1.0);
  finishReduction(&d, 1, DType::F64, ReduceOp::Avg, 4);
  EXPECT_EQ(d, 0.25);
}

TEST(ReduceKernels, ScaleInPlaceFloatsOnly) {
  double d[2] = {2.0, -4.0};
  scaleInPlace(d, 2, DType::F64, 0.5);
  EXPECT_EQ(d[0], 1.0);
  EXPECT_EQ(d[1], -2.0);
  uint16_t h = floatToHalf(3.0f);
  scaleInPlace(&h, 1, DType::F16, 0.25);
  EXPECT_EQ(halfToFloat(h), 0.75f);
  int32_t i = 4;
  EXPECT_THROW(scaleInPlace(&i, 1, DType::I32, 0.5), InvalidArgument);
}

}  // namespace
}  // namespace kolo::comm::detail
