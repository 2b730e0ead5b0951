// A parameter server's state in a file, for the chief's checkpoints and --resume: the
// server's values ("value/<slice>"), its optimizer state ("state/<slice>/<slot>") and its
// version, with the server's index, the optimizer's kind, step and last rate as metadata.
#pragma once

#include <cstdint>
#include <map>
#include <string>

#include "kolo/optim.h"
#include "kolo/parallel/parameter_server.h"

namespace kolo::parallel::ps::detail {

/// Writes server `index`'s slices (`views`, named as `optimizer` knows them), the optimizer's
/// state and `version` to `path`.
void saveServerState(const std::string& path, int index, const NamedTensors& views,
                     optim::Optimizer& optimizer, int64_t version);

/// What the metadata of a server's checkpoint says: the version of its values and the step
/// count of its optimizer.
struct ServerStateFacts {
  int64_t version = 0;
  int64_t step = 0;
};

/// Checks the metadata of server checkpoint `path` (server_state_metadata.cc, apart from the
/// file so that fuzz/ps_server_state_fuzz.cc drives it): FormatError naming the file and the
/// key when one is missing or "version" or "step" is not a non-negative decimal integer,
/// Mismatch when the file was written by another server than `index` or for another optimizer
/// than `optimizer`.
ServerStateFacts checkServerStateMetadata(const std::map<std::string, std::string>& metadata,
                                          const std::string& path, int index,
                                          const std::string& optimizer);

/// The inverse of saveServerState: fills `views` and `optimizer` and returns the version.
/// Throws FormatError or Mismatch naming the file when it does not fit this server.
int64_t restoreServerState(const std::string& path, int index, const NamedTensors& views,
                           optim::Optimizer& optimizer);

}  // namespace kolo::parallel::ps::detail
