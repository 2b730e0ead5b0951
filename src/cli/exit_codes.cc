// The exception -> exit code table of the `kolo` program (exit_codes.h).
#include "cli/exit_codes.h"

#include "kolo/error.h"

namespace kolo::cli {
namespace {

template <class... Kinds>
bool isAny(const std::exception& error) {
  return (... || (dynamic_cast<const Kinds*>(&error) != nullptr));
}

// More specific kinds come before their bases (FileError and PeerError before IoError).
constexpr ExitCodeRow kTable[] = {
    // Before InvalidArgument, of which it is a kind: a failed invariant is not a flag.
    {kExitCheckFailed, "InternalError (a failed KOLO_CHECK)",
     "an internal check failed: a bug in kolo or in the program calling it; the message names "
     "the check and its source line",
     isAny<InternalError>},
    {kExitUsage, "InvalidArgument, command-line parse errors",
     "a flag, option value or KOLO_* setting is not accepted; the message says which and what is",
     isAny<InvalidArgument>},
    {kExitInputFile, "FileError, FormatError",
     "a file or directory named by the user (data, --init, --resume) is missing, unreadable or "
     "malformed",
     isAny<FileError, FormatError>},
    {kExitDiverged, "DivergedError", "training diverged: the loss is no longer finite",
     isAny<DivergedError>},
    {kExitOutOfSync, "ReplicaMismatch",
     "the replicas' weights differ between ranks (--check-sync names the ranks and the first "
     "tensor)",
     isAny<ReplicaMismatch>},
    {kExitJob, "PeerError, Timeout, Mismatch",
     "another rank failed or vanished, a collective passed its deadline, or ranks disagreed",
     isAny<PeerError, Timeout, Mismatch>},
    {kExitSystem, "IoError", "an operating-system failure: disk, sockets, shared memory, fork",
     isAny<IoError>},
    {kExitInternal, "Error, any other exception", "a bug or an unexpected failure",
     isAny<std::exception>},
};

}  // namespace

std::span<const ExitCodeRow> exitCodeTable() { return kTable; }

ExitCode exitCodeFor(const std::exception& error) {
  for (const ExitCodeRow& row : kTable) {
    if (row.matches(error)) return row.code;
  }
  return kExitInternal;
}

}  // namespace kolo::cli
