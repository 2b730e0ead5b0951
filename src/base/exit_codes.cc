// The exception -> exit code table of kolo's programs (kolo/exit_codes.h), and kolo::main,
// which applies it to what ends a program.
#include "kolo/exit_codes.h"

#include <cstdio>
#include <cstring>
#include <string>

#include "kolo/error.h"

namespace kolo {
namespace {

template <class... Kinds>
bool isAny(const std::exception& error) {
  return (... || (dynamic_cast<const Kinds*>(&error) != nullptr));
}

// More specific kinds come before their bases (FileError and PeerError before IoError).
constexpr ExitCodeRow kTable[] = {
    // Before InvalidArgument, of which it is a kind: a failed invariant is not a usage error.
    {kExitCheckFailed, "InternalError (a failed KOLO_CHECK)",
     "an internal check failed: a bug in kolo or in the program calling it; the message names "
     "the check and its source line",
     isAny<InternalError>},
    {kExitUsage, "InvalidArgument, command-line parse errors",
     "an option value or KOLO_* setting is not accepted; the message says which and what is",
     isAny<InvalidArgument>},
    {kExitInputFile, "FileError, FormatError",
     "a file or directory named by the user (data, weights, checkpoints) is missing, "
     "unreadable or malformed",
     isAny<FileError, FormatError>},
    {kExitDiverged, "DivergedError", "training diverged: the loss is no longer finite",
     isAny<DivergedError>},
    {kExitOutOfSync, "ReplicaMismatch",
     "the replicas' weights differ between ranks (the weight-sync check names the ranks and "
     "the first tensor)",
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

int main(int argc, char** argv, const std::function<int(int, char**)>& body) {
  const char* program = argc > 0 && argv[0] != nullptr ? argv[0] : "program";
  if (const char* slash = std::strrchr(program, '/')) program = slash + 1;
  try {
    return body(argc, argv);
  } catch (const InternalError& e) {
    std::fprintf(stderr, "%s: internal error: %s\n", program, e.what());
    return exitCodeFor(e);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "%s: error: %s\n", program, e.what());
    return exitCodeFor(e);
  } catch (...) {
    std::fprintf(stderr, "%s: error: an exception that is not a std::exception\n", program);
    return kExitInternal;
  }
}

}  // namespace kolo
