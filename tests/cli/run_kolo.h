// Runs the built `kolo` binary with arguments through the shell and captures its output;
// shared by the end-to-end tests of the `kolo` commands.
#pragma once

#include <sys/wait.h>

#include <cstdio>
#include <string>

namespace kolo::testing {

struct RunResult {
  int exitCode = -1;
  std::string output;  // stdout and stderr together
};

/// Runs `kolo ARGS`; `environment` ("env -i A=1 ..." or "A=1") is put before the binary.
inline RunResult runKolo(const std::string& args, const std::string& environment = "") {
  const std::string command =
      environment + " " + std::string(KOLO_BINARY_DIR) + "/src/cli/kolo " + args + " 2>&1";
  RunResult result;
  std::FILE* pipe = ::popen(command.c_str(), "r");
  if (!pipe) return result;
  char buffer[4096];
  size_t got;
  while ((got = std::fread(buffer, 1, sizeof(buffer), pipe)) > 0) result.output.append(buffer, got);
  const int status = ::pclose(pipe);
  result.exitCode = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  return result;
}

}  // namespace kolo::testing
