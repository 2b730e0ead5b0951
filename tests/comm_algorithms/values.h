// Closed-form inputs and expected results for collective tests: rank r contributes
// (r + 1) + (i % 7) at index i (sum = n(n+1)/2 + n(i % 7), min = 1 + i % 7, max = n + i % 7),
// or, for prod, 2 where (r + i) is odd and 1 elsewhere (prod = 2^#odd). All are exact in
// every dtype for n <= 8.
#pragma once

#include <cstddef>
#include <string>
#include <vector>

#include "kolo/comm/communicator.h"
#include "kolo/dtype.h"

namespace kolo::comm::testing {

/// Value of element i contributed by rank r for op, as a double.
double contribution(int rank, size_t index, ReduceOp op);
/// count elements of dtype from contribution(rank, i, op).
std::vector<char> makeInput(DType dtype, size_t count, int rank, ReduceOp op);
/// The reduction over n ranks, in closed form, as dtype bytes.
std::vector<char> expectedResult(DType dtype, size_t count, int n, ReduceOp op);
/// "" when equal, otherwise a description of the first differing element.
std::string firstDifference(DType dtype, const void* got, const void* want, size_t count);

}  // namespace kolo::comm::testing
