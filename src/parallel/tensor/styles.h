// The styles of a tensor-parallel plan applied to one module each: what a style needs of the
// module (checked before anything is split) and the in-place split (parameters become this
// rank's shards, transforms carry the collectives). Used by TensorParallelModel.
#pragma once

#include <map>
#include <memory>
#include <string>
#include <vector>

#include "kolo/parallel/tensor_parallel.h"

namespace kolo::parallel::detail {

/// Whether `path` matches `pattern` whole, "*" matching any run of characters (dots too).
bool pathMatches(const std::string& pattern, const std::string& path);

/// Whether the style splits the module's children itself (so the plan matches none of them).
bool coversChildren(const nn::Module& module, const ParallelStyle& style);

/// What splitting modules in place writes down and shares.
struct SplitContext {
  std::shared_ptr<comm::Communicator> comm{};
  bool sequenceParallel = false;
  /// Whole-model names of the split parameters.
  std::map<std::string, ShardSpec> specs{};
  /// Tensors already split (a tied table and head share one), with how.
  std::map<const TensorImpl*, ShardSpec> splitTensors{};
  /// The sequence-parallel norms' parameters, summed over the ranks after backward.
  std::vector<Tensor> sequenceParameters{};
  bool vocabularyOutput = false;
  /// Each module given transforms, with how many forwards through operator() reached it.
  std::vector<std::pair<std::string, std::shared_ptr<int64_t>>> reached{};
};

/// Throws InvalidArgument, naming `path`, the style and the shapes, when `module` lacks what
/// `style` splits or T = parts does not divide a split size.
void checkStyle(const std::string& path, nn::Module& module, const ParallelStyle& style, int parts);

/// One parameter a style splits: its whole-model name, the tensor, and how it is cut.
struct PlannedSplit {
  std::string name;
  Tensor tensor;
  ShardSpec spec;
};

/// The parameters applyStyle would split in `module` (at `path`), without splitting them;
/// checkStyle must have passed.
std::vector<PlannedSplit> plannedSplits(const std::string& path, nn::Module& module, const ParallelStyle& style);

/// Splits `module` (at `path`) in place as `style` says; checkStyle must have passed.
void applyStyle(const std::string& path, nn::Module& module, const ParallelStyle& style,
                SplitContext& context);

}  // namespace kolo::parallel::detail
