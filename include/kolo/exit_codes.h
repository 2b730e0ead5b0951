// The exit codes of kolo's programs, one table: which exception kinds end in which code, so
// that a program of one's own exits as `kolo` does (docs/exit_codes.md) and a launcher can
// tell a usage error, which no restart mends, from a lost peer, which an elastic job survives.
#pragma once

#include <exception>
#include <functional>
#include <span>

namespace kolo {

enum ExitCode : int {
  kExitOk = 0,
  kExitInternal = 1,      // a bug or an unexpected failure
  kExitUsage = 2,         // an option value or KOLO_* setting that is not accepted
  kExitInputFile = 3,     // a named file or directory is missing, unreadable or malformed
  kExitDiverged = 4,      // the loss or a gradient stopped being finite
  kExitJob = 5,           // another rank failed, timed out or disagreed
  kExitSystem = 6,        // an operating-system failure: disk, sockets, shared memory, fork
  kExitOutOfSync = 7,     // the ranks' weights differ (FitOptions::checkSyncEvery)
  kExitCheckFailed = 8,   // an internal check (KOLO_CHECK) failed: a bug
};

/// One row: the code, the exception kinds that end in it, and what it means.
struct ExitCodeRow {
  ExitCode code;
  const char* kinds;
  const char* meaning;
  bool (*matches)(const std::exception& error);
};

/// The rows, checked in order: the first that matches an exception gives its code.
std::span<const ExitCodeRow> exitCodeTable();

/// The exit code for an exception that ended a program: kExitUsage for InvalidArgument,
/// kExitJob for PeerError, Timeout and Mismatch, ... (exitCodeTable, docs/exit_codes.md);
/// kExitInternal for an exception that is not a kolo::Error.
ExitCode exitCodeFor(const std::exception& error);

/// Runs `body(argc, argv)` and returns what it returns; an exception that escapes it is
/// printed on stderr as "PROGRAM: error: MESSAGE" (a failed KOLO_CHECK as "PROGRAM: internal
/// error: ...") and turned into its exit code by exitCodeFor, so that `kolo run` reports it
/// and an elastic job does not restart a rank that ended for a usage error. Meant as the
/// whole of a program's main: `int main(int argc, char** argv) { return kolo::main(argc,
/// argv, train); }`. Never throws.
int main(int argc, char** argv, const std::function<int(int, char**)>& body);

}  // namespace kolo
