// Byte sizes as people write them ("4096", "64K", "1.5G", "64MiB"): one parser for every
// size a user types, `kolo train --memory-limit` and `kolo bench`'s sweeps alike.
#pragma once

#include <cstddef>
#include <string>

namespace kolo {

/// Parses a whole or decimal number with an optional binary suffix K, M or G (1024, 1024²,
/// 1024³; any case, optionally followed by "B" or "iB"; a bare "B" means bytes), rounded
/// down to whole bytes: "4096", "4k", "64MiB", "16KB", "1.5G". Throws InvalidArgument
/// naming `text` for anything else (no digits, a sign, another suffix, more than size_t holds).
size_t parseByteSize(const std::string& text);

}  // namespace kolo
