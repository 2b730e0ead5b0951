// Buffers of the closed-form values of comm/closed_form.h for the algorithm tests, which
// compare results bit for bit, and that bitwise comparison.
#pragma once

#include <cstddef>
#include <string>
#include <vector>

#include "kolo/comm/communicator.h"
#include "kolo/dtype.h"

namespace kolo::comm::testing {

/// count elements of dtype: rank `rank`'s closed-form input to `op` over `ranks` ranks
/// (one spare byte, so data() is never null for count 0).
std::vector<char> makeInput(DType dtype, size_t count, int rank, int ranks, ReduceOp op);
/// The reduction over `ranks` ranks, in closed form, as dtype bytes.
std::vector<char> expectedResult(DType dtype, size_t count, int ranks, ReduceOp op);
/// "" when equal, otherwise a description of the first differing element.
std::string firstDifference(DType dtype, const void* got, const void* want, size_t count);

}  // namespace kolo::comm::testing
