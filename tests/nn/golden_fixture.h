// Reading the golden fixtures that tests/fixtures/make_golden*.py write (named f32/i64
// records, optionally every k-th element) and comparing kolo's tensors with them.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <fstream>
#include <map>
#include <string>
#include <vector>

#include "kolo/error.h"
#include "kolo/tensor.h"

namespace kolo::golden {

struct Record {
  Shape shape;
  int64_t stride = 1;  // stored every stride-th flat element
  std::vector<double> values;
};

/// Every record of the fixture at `path` by name. Throws IoError when it cannot be opened,
/// FormatError when it ends inside a record.
inline std::map<std::string, Record> readFixture(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) KOLO_THROW(IoError, "cannot open fixture ", path);
  std::map<std::string, Record> out;
  auto read = [&](void* p, size_t n) {
    in.read(static_cast<char*>(p), static_cast<std::streamsize>(n));
    if (!in) KOLO_THROW(FormatError, "truncated fixture ", path);
  };
  while (in.peek() != EOF) {
    uint32_t nameLen;
    read(&nameLen, 4);
    std::string name(nameLen, '\0');
    read(name.data(), nameLen);
    uint8_t dtype;
    uint32_t ndim;
    read(&dtype, 1);
    read(&ndim, 4);
    Record r;
    r.shape.resize(ndim);
    read(r.shape.data(), 8 * ndim);
    uint64_t count;
    read(&r.stride, 8);
    read(&count, 8);
    r.values.resize(count);
    for (uint64_t i = 0; i < count; ++i) {
      if (dtype == 0) {
        float v;
        read(&v, 4);
        r.values[i] = v;
      } else {
        int64_t v;
        read(&v, 8);
        r.values[i] = static_cast<double>(v);
      }
    }
    out.emplace(name, std::move(r));
  }
  return out;
}

/// max |actual - expected| / max |expected| over the stored elements.
inline double relativeError(const Tensor& actual, const Record& expected) {
  EXPECT_EQ(actual.shape(), expected.shape);
  std::vector<double> a = actual.toDoubleVector();
  double maxDiff = 0.0, maxRef = 0.0;
  for (size_t j = 0; j < expected.values.size(); ++j) {
    const double ref = expected.values[j];
    maxDiff = std::max(maxDiff, std::abs(a[j * expected.stride] - ref));
    maxRef = std::max(maxRef, std::abs(ref));
  }
  return maxRef > 0 ? maxDiff / maxRef : maxDiff;
}

/// max |a - b| / max |b| between two tensors of one size (b the reference).
inline double relativeDifference(const Tensor& a, const Tensor& b) {
  const std::vector<double> x = a.toDoubleVector(), y = b.toDoubleVector();
  EXPECT_EQ(x.size(), y.size());
  double diff = 0.0, scale = 1e-12;
  for (size_t i = 0; i < std::min(x.size(), y.size()); ++i) {
    diff = std::max(diff, std::abs(x[i] - y[i]));
    scale = std::max(scale, std::abs(y[i]));
  }
  return diff / scale;
}

/// A whole (unstrided) record as a tensor of `dtype`.
inline Tensor toTensor(const Record& r, DType dtype) {
  KOLO_CHECK_EQ(r.stride, 1, "toTensor of a strided record");
  std::vector<double> v = r.values;
  return Tensor::fromVector(r.shape, v).to(dtype);
}

}  // namespace kolo::golden
