// Closed-form buffers and the bitwise comparison (see values.h).
#include "comm_algorithms/values.h"

#include <cstring>
#include <sstream>

#include "comm/closed_form.h"

namespace kolo::comm::testing {

std::vector<char> makeInput(DType dtype, size_t count, int rank, int ranks, ReduceOp op) {
  std::vector<char> out(count * dtypeSize(dtype) + 1);
  detail::fillClosedFormInput(out.data(), dtype, count, op, rank, ranks);
  return out;
}

std::vector<char> expectedResult(DType dtype, size_t count, int ranks, ReduceOp op) {
  std::vector<char> out(count * dtypeSize(dtype) + 1);
  detail::fillClosedFormResult(out.data(), dtype, count, op, ranks);
  return out;
}

std::string firstDifference(DType dtype, const void* got, const void* want, size_t count) {
  const size_t esize = dtypeSize(dtype);
  for (size_t i = 0; i < count; ++i) {
    if (std::memcmp(static_cast<const char*>(got) + i * esize, static_cast<const char*>(want) + i * esize, esize) != 0) {
      std::ostringstream msg;
      msg << dtypeName(dtype) << " element " << i << " of " << count << ": got " << loadElement(dtype, got, i)
          << ", want " << loadElement(dtype, want, i);
      return msg.str();
    }
  }
  return "";
}

}  // namespace kolo::comm::testing
