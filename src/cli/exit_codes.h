// The exit codes of the `kolo` program, one table: which exception kinds end in which code.
// docs/exit_codes.md prints the same table for users; tests/cli checks a row of each.
#pragma once

#include <exception>
#include <span>

namespace kolo::cli {

enum ExitCode : int {
  kExitOk = 0,
  kExitInternal = 1,   // a bug or an unexpected failure
  kExitUsage = 2,      // a flag, option value or KOLO_* setting that is not accepted
  kExitInputFile = 3,  // a named file or directory is missing, unreadable or malformed
  kExitDiverged = 4,   // the loss or a gradient stopped being finite
  kExitJob = 5,        // another rank failed, timed out or disagreed
  kExitSystem = 6,     // an operating-system failure: disk, sockets, shared memory, fork
  kExitOutOfSync = 7,  // the ranks' weights differ (--check-sync)
  kExitCheckFailed = 8,  // an internal check (KOLO_CHECK) failed: a bug
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

/// The exit code for an exception that ended a command.
ExitCode exitCodeFor(const std::exception& error);

}  // namespace kolo::cli
