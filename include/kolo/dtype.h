// Element types shared by the tensor core and the communication layer, with the
// f16/bf16 <-> f32 conversions used for storage and for the wire.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>

namespace kolo {

enum class DType : uint8_t { F32, F64, F16, BF16, I32, I64, U8 };

/// Bytes per element.
size_t dtypeSize(DType dtype);
/// Lower-case name: "f32", "f64", "f16", "bf16", "i32", "i64", "u8".
const char* dtypeName(DType dtype);
/// Parses a name as printed by dtypeName (also accepts "float32", "float", "half"...);
/// throws InvalidArgument for anything else.
DType parseDType(const std::string& name);

/// IEEE binary16 conversions (round to nearest even).
uint16_t floatToHalf(float value);
float halfToFloat(uint16_t bits);
/// bfloat16 conversions (round to nearest even; NaN stays NaN).
uint16_t floatToBFloat16(float value);
float bfloat16ToFloat(uint16_t bits);

/// Element `i` of a buffer of `dtype` as a double (f16/bf16 widened exactly). The buffer
/// need not be aligned.
double loadElement(DType dtype, const void* data, size_t i);
/// Stores `value` as element `i` of a buffer of `dtype`: rounded to nearest for the
/// floating types, truncated toward zero for the integers (u8 keeps the low 8 bits).
void storeElement(DType dtype, void* data, size_t i, double value);

}  // namespace kolo
