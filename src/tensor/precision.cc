// This thread's matmul precision (kolo/precision.h).
#include "kolo/precision.h"

#include "kolo/error.h"
#include "tensor/bf16_gemm.h"

namespace kolo {

namespace {
thread_local MatmulPrecision currentPrecision = MatmulPrecision::F32;
}  // namespace

MatmulPrecision matmulPrecision() { return currentPrecision; }
void setMatmulPrecision(MatmulPrecision precision) { currentPrecision = precision; }

MatmulPrecision parseMatmulPrecision(const std::string& text) {
  if (text == "f32") return MatmulPrecision::F32;
  if (text == "bf16") return MatmulPrecision::BF16;
  KOLO_THROW(InvalidArgument, "precision '", text, "' is not accepted: use f32 or bf16");
}

bool nativeBf16() { return detail::haveNativeBf16(); }

}  // namespace kolo
