// DType sizes, names and the f16/bf16 conversions (round-trip and rounding).
#include "kolo/dtype.h"

#include <gtest/gtest.h>

#include <vector>

#include <cmath>
#include <limits>

#include "kolo/error.h"

namespace kolo {
namespace {

TEST(DType, SizesAndNames) {
  EXPECT_EQ(dtypeSize(DType::F32), 4u);
  EXPECT_EQ(dtypeSize(DType::BF16), 2u);
  EXPECT_EQ(dtypeSize(DType::I64), 8u);
  for (DType d : {DType::F32, DType::F64, DType::F16, DType::BF16, DType::I32, DType::I64, DType::U8})
    EXPECT_EQ(parseDType(dtypeName(d)), d);
  EXPECT_THROW(parseDType("f8"), InvalidArgument);
}

TEST(DType, HalfRoundTripsExactValues) {
  for (float v : {0.0f, 1.0f, -2.5f, 65504.0f, 6.103515625e-05f, 5.960464477539063e-08f, 0.333251953125f})
    EXPECT_EQ(halfToFloat(floatToHalf(v)), v) << v;
  EXPECT_TRUE(std::isinf(halfToFloat(floatToHalf(1e6f))));
  EXPECT_TRUE(std::isnan(halfToFloat(floatToHalf(std::numeric_limits<float>::quiet_NaN()))));
  // 1 + 2^-11 is halfway between 1 and the next half; ties go to even (1.0).
  EXPECT_EQ(halfToFloat(floatToHalf(1.0f + 0.00048828125f)), 1.0f);
}

TEST(DType, BFloat16RoundTripsAndRounds) {
  for (float v : {0.0f, 1.0f, -3.0f, 1.5f, 3.3895313892515355e38f}) EXPECT_EQ(bfloat16ToFloat(floatToBFloat16(v)), v);
  EXPECT_NEAR(bfloat16ToFloat(floatToBFloat16(3.14159f)), 3.14159f, 0.01f);
  EXPECT_TRUE(std::isnan(bfloat16ToFloat(floatToBFloat16(std::numeric_limits<float>::quiet_NaN()))));
}

TEST(DType, ElementsStoreAndLoadThroughDoublesAtAnyAlignment) {
  const DType all[] = {DType::F32, DType::F64, DType::F16, DType::BF16,
                       DType::I32, DType::I64, DType::U8};
  for (DType dtype : all) {
    std::vector<char> bytes(1 + 4 * dtypeSize(dtype));
    void* unaligned = bytes.data() + 1;
    for (size_t i = 0; i < 4; ++i) storeElement(dtype, unaligned, i, 3.0 * i);
    for (size_t i = 0; i < 4; ++i)
      EXPECT_EQ(loadElement(dtype, unaligned, i), 3.0 * i) << dtypeName(dtype) << " " << i;
  }
  std::vector<char> bytes(8);
  storeElement(DType::F16, bytes.data(), 0, 1.0 + 1.0 / 4096);  // rounds to even: 1.0
  EXPECT_EQ(loadElement(DType::F16, bytes.data(), 0), 1.0);
  storeElement(DType::I32, bytes.data(), 0, -2.75);  // truncates toward zero
  EXPECT_EQ(loadElement(DType::I32, bytes.data(), 0), -2.0);
  storeElement(DType::U8, bytes.data(), 0, 300.0);  // keeps the low 8 bits
  EXPECT_EQ(loadElement(DType::U8, bytes.data(), 0), 44.0);
}

TEST(ErrorMacros, CheckEqNamesBothSides) {
  try {
    KOLO_CHECK_EQ(2 + 2, 5, "in test");
    FAIL();
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("4 vs 5"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace kolo
