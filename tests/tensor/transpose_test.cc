// The f32 transpose against the element-by-element definition, over sizes around the
// 16 x 16 squares (edges of every width), leading dimensions wider than the matrix, and
// padding in the destination that must stay untouched.
#include "tensor/transpose.h"

#include <gtest/gtest.h>

#include <vector>

namespace kolo::detail {
namespace {

TEST(TransposeF32, MatchesTheDefinitionOverSquaresAndEdges) {
  for (int64_t rows : {1, 7, 16, 17, 33, 64})
    for (int64_t cols : {1, 15, 16, 31, 32, 48}) {
      SCOPED_TRACE(::testing::Message() << rows << " x " << cols);
      const int64_t ld = cols + 3, ldTo = rows + 5;
      std::vector<float> from(static_cast<size_t>(rows * ld));
      for (size_t i = 0; i < from.size(); ++i) from[i] = static_cast<float>(i) * 0.5f - 7.0f;
      std::vector<float> to(static_cast<size_t>(cols * ldTo), -1.0f);
      transposeF32(rows, cols, from.data(), ld, to.data(), ldTo);
      for (int64_t c = 0; c < cols; ++c)
        for (int64_t r = 0; r < ldTo; ++r) {
          const float got = to[static_cast<size_t>(c * ldTo + r)];
          if (r < rows)
            ASSERT_EQ(got, from[static_cast<size_t>(r * ld + c)]) << "to[" << c << ", " << r << "]";
          else
            ASSERT_EQ(got, -1.0f) << "padding to[" << c << ", " << r << "] was written";
        }
    }
}

}  // namespace
}  // namespace kolo::detail
