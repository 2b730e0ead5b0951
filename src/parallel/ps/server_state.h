// A parameter server's state in a file, for the chief's checkpoints and --resume: the
// server's values ("value/<slice>"), its optimizer state ("state/<slice>/<slot>") and its
// version, with the server's index, the optimizer's kind, step and last rate as metadata.
#pragma once

#include <cstdint>
#include <string>

#include "kolo/optim.h"
#include "kolo/parallel/parameter_server.h"

namespace kolo::parallel::ps::detail {

/// Writes server `index`'s slices (`views`, named as `optimizer` knows them), the optimizer's
/// state and `version` to `path`.
void saveServerState(const std::string& path, int index, const NamedTensors& views,
                     optim::Optimizer& optimizer, int64_t version);

/// The inverse of saveServerState: fills `views` and `optimizer` and returns the version.
/// Throws FormatError or Mismatch naming the file when it does not fit this server.
int64_t restoreServerState(const std::string& path, int index, const NamedTensors& views,
                           optim::Optimizer& optimizer);

}  // namespace kolo::parallel::ps::detail
