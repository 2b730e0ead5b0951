// The precision of matrix products on this thread (torch.autocast's role for kolo): f32, or
// bf16 products with f32 accumulation — operands rounded to bfloat16 (nearest even), sums
// and results in f32, weights, gradients and optimizer state left in f32.
#pragma once

#include <string>

namespace kolo {

enum class MatmulPrecision { F32, BF16 };

/// This thread's precision for f32 matrix products (matmul, linear, bmm, conv2d, attention):
/// F32 by default. f64 products are never affected.
MatmulPrecision matmulPrecision();
/// Sets this thread's precision (for a whole run; scoped use: MatmulPrecisionGuard).
void setMatmulPrecision(MatmulPrecision precision);
/// "f32" -> F32, "bf16" -> BF16; throws InvalidArgument naming `text` otherwise.
MatmulPrecision parseMatmulPrecision(const std::string& text);
/// Whether this CPU computes bf16 products natively (AVX-512 BF16); without it they take a
/// slower path with the same rounding of the operands.
bool nativeBf16();

/// RAII scope with another matmul precision on this thread.
class MatmulPrecisionGuard {
 public:
  explicit MatmulPrecisionGuard(MatmulPrecision precision) : previous_(matmulPrecision()) {
    setMatmulPrecision(precision);
  }
  ~MatmulPrecisionGuard() { setMatmulPrecision(previous_); }
  MatmulPrecisionGuard(const MatmulPrecisionGuard&) = delete;
  MatmulPrecisionGuard& operator=(const MatmulPrecisionGuard&) = delete;

 private:
  MatmulPrecision previous_;
};

}  // namespace kolo
