// DType names, sizes and the half-precision conversions.
#include "kolo/dtype.h"

#include "kolo/error.h"

namespace kolo {

size_t dtypeSize(DType dtype) {
  switch (dtype) {
    case DType::F32: return 4;
    case DType::F64: return 8;
    case DType::F16: return 2;
    case DType::BF16: return 2;
    case DType::I32: return 4;
    case DType::I64: return 8;
    case DType::U8: return 1;
  }
  KOLO_THROW(InvalidArgument, "unknown dtype code ", static_cast<int>(dtype));
}

const char* dtypeName(DType dtype) {
  switch (dtype) {
    case DType::F32: return "f32";
    case DType::F64: return "f64";
    case DType::F16: return "f16";
    case DType::BF16: return "bf16";
    case DType::I32: return "i32";
    case DType::I64: return "i64";
    case DType::U8: return "u8";
  }
  return "unknown";
}

DType parseDType(const std::string& name) {
  if (name == "f32" || name == "float32" || name == "float") return DType::F32;
  if (name == "f64" || name == "float64" || name == "double") return DType::F64;
  if (name == "f16" || name == "float16" || name == "half") return DType::F16;
  if (name == "bf16" || name == "bfloat16") return DType::BF16;
  if (name == "i32" || name == "int32") return DType::I32;
  if (name == "i64" || name == "int64") return DType::I64;
  if (name == "u8" || name == "uint8") return DType::U8;
  KOLO_THROW(InvalidArgument, "unknown dtype '", name, "' (expected f32, f64, f16, bf16, i32, i64 or u8)");
}

uint16_t floatToHalf(float value) {
  uint32_t x;
  std::memcpy(&x, &value, 4);
  const uint32_t sign = (x >> 16) & 0x8000u;
  const uint32_t absx = x & 0x7fffffffu;
  if (absx >= 0x7f800000u) {  // inf or NaN
    return static_cast<uint16_t>(sign | 0x7c00u | (absx > 0x7f800000u ? 0x200u : 0u));
  }
  if (absx >= 0x477ff000u) return static_cast<uint16_t>(sign | 0x7c00u);  // overflow -> inf
  if (absx < 0x38800000u) {  // subnormal half or zero
    if (absx < 0x33000000u) return static_cast<uint16_t>(sign);
    const uint32_t mant = (absx & 0x007fffffu) | 0x00800000u;
    const int shift = 113 - static_cast<int>(absx >> 23) + 13;
    uint32_t half = mant >> shift;
    const uint32_t rem = mant & ((1u << shift) - 1u);
    const uint32_t halfway = 1u << (shift - 1);
    if (rem > halfway || (rem == halfway && (half & 1u))) ++half;
    return static_cast<uint16_t>(sign | half);
  }
  uint32_t half = ((absx - 0x38000000u) >> 13);
  const uint32_t rem = absx & 0x1fffu;
  if (rem > 0x1000u || (rem == 0x1000u && (half & 1u))) ++half;
  return static_cast<uint16_t>(sign | half);
}

float halfToFloat(uint16_t bits) {
  const uint32_t sign = (static_cast<uint32_t>(bits) & 0x8000u) << 16;
  uint32_t exp = (bits >> 10) & 0x1fu;
  uint32_t mant = bits & 0x3ffu;
  uint32_t out;
  if (exp == 0) {
    if (mant == 0) {
      out = sign;
    } else {  // normalise the subnormal
      exp = 127 - 15 + 1;
      while ((mant & 0x400u) == 0) {
        mant <<= 1;
        --exp;
      }
      mant &= 0x3ffu;
      out = sign | (exp << 23) | (mant << 13);
    }
  } else if (exp == 0x1f) {
    out = sign | 0x7f800000u | (mant << 13);
  } else {
    out = sign | ((exp + 127 - 15) << 23) | (mant << 13);
  }
  float f;
  std::memcpy(&f, &out, 4);
  return f;
}

uint16_t floatToBFloat16(float value) {
  uint32_t x;
  std::memcpy(&x, &value, 4);
  if ((x & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((x >> 16) | 0x40u);
  const uint32_t rounding = 0x7fffu + ((x >> 16) & 1u);
  return static_cast<uint16_t>((x + rounding) >> 16);
}

float bfloat16ToFloat(uint16_t bits) {
  const uint32_t x = static_cast<uint32_t>(bits) << 16;
  float f;
  std::memcpy(&f, &x, 4);
  return f;
}

double loadElement(DType dtype, const void* data, size_t i) {
  const char* p = static_cast<const char*>(data) + i * dtypeSize(dtype);
  auto read = [p](auto x) {
    std::memcpy(&x, p, sizeof(x));
    return x;
  };
  switch (dtype) {
    case DType::F32: return read(float{});
    case DType::F64: return read(double{});
    case DType::F16: return halfToFloat(read(uint16_t{}));
    case DType::BF16: return bfloat16ToFloat(read(uint16_t{}));
    case DType::I32: return read(int32_t{});
    case DType::I64: return static_cast<double>(read(int64_t{}));
    case DType::U8: return read(uint8_t{});
  }
  return 0.0;
}

void storeElement(DType dtype, void* data, size_t i, double value) {
  char* p = static_cast<char*>(data) + i * dtypeSize(dtype);
  auto write = [p](auto x) { std::memcpy(p, &x, sizeof(x)); };
  switch (dtype) {
    case DType::F32: return write(static_cast<float>(value));
    case DType::F64: return write(value);
    case DType::F16: return write(floatToHalf(static_cast<float>(value)));
    case DType::BF16: return write(floatToBFloat16(static_cast<float>(value)));
    case DType::I32: return write(static_cast<int32_t>(value));
    case DType::I64: return write(static_cast<int64_t>(value));
    case DType::U8: return write(static_cast<uint8_t>(static_cast<int64_t>(value) & 0xff));
  }
}

}  // namespace kolo
