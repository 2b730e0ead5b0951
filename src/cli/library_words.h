// The one place where the library's words become the command line's: an error from the
// library names its options (FitOptions::batch, ParameterServerOptions::unitBatches), and
// `kolo` prints the flag that sets each (--batch, --ps-unit-batches) instead.
#pragma once

#include <string>

namespace kolo::cli {

/// `message` with every library option it names (Type::member) replaced by the `kolo` flag
/// that sets it, and "kolo's launcher" (of an elastic job, of P servers and W workers, ...) by
/// the `kolo run` command that starts such a job; names no flag sets are left as they are.
std::string inFlagWords(const std::string& message);

}  // namespace kolo::cli
