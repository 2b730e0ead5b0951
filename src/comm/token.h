// Random job tokens and hex text: the launcher's job token, the native rendezvous's token
// and probe word, and the store's file names all draw from here, so there is one source of
// randomness (the kernel's, through getrandom) and one hex alphabet.
#pragma once

#include <cstddef>
#include <string>

namespace kolo::comm::detail {

/// Fills `bytes` bytes at `out` from the kernel's random source (getrandom), retrying
/// interrupted and short reads. Throws IoError when the kernel refuses.
void randomBytes(void* out, size_t bytes);

/// Lower-case hex text of `bytes` bytes: two digits a byte, high nibble first.
std::string hexText(const void* data, size_t bytes);

/// A fresh token: `bytes` random bytes as hex text (2 * bytes characters).
std::string randomToken(size_t bytes = 16);

}  // namespace kolo::comm::detail
