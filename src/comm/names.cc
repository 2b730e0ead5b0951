// Names of reduction operations and collective algorithms, for options, KOLO_ALGO,
// benchmark tables and error messages.
#include "kolo/comm/communicator.h"
#include "kolo/error.h"

namespace kolo::comm {

const char* reduceOpName(ReduceOp op) {
  switch (op) {
    case ReduceOp::Sum: return "sum";
    case ReduceOp::Prod: return "prod";
    case ReduceOp::Min: return "min";
    case ReduceOp::Max: return "max";
    case ReduceOp::Avg: return "avg";
  }
  return "unknown";
}

ReduceOp parseReduceOp(const std::string& name) {
  if (name == "sum") return ReduceOp::Sum;
  if (name == "prod" || name == "product") return ReduceOp::Prod;
  if (name == "min") return ReduceOp::Min;
  if (name == "max") return ReduceOp::Max;
  if (name == "avg" || name == "mean" || name == "average") return ReduceOp::Avg;
  KOLO_THROW(InvalidArgument, "unknown reduce op '", name, "' (expected sum, prod, min, max or avg)");
}

const char* algorithmName(Algorithm algo) {
  switch (algo) {
    case Algorithm::Auto: return "auto";
    case Algorithm::Ring: return "ring";
    case Algorithm::HalvingDoubling: return "halving-doubling";
    case Algorithm::Tree: return "tree";
    case Algorithm::ReduceBroadcast: return "reduce-broadcast";
    case Algorithm::Hierarchical: return "hierarchical";
  }
  return "unknown";
}

Algorithm parseAlgorithm(const std::string& name) {
  if (name == "auto" || name.empty()) return Algorithm::Auto;
  if (name == "ring") return Algorithm::Ring;
  if (name == "halving-doubling" || name == "hd" || name == "rhd" || name == "halving_doubling")
    return Algorithm::HalvingDoubling;
  if (name == "tree" || name == "binomial") return Algorithm::Tree;
  if (name == "reduce-broadcast" || name == "reduce_broadcast" || name == "flat") return Algorithm::ReduceBroadcast;
  if (name == "hierarchical" || name == "hier") return Algorithm::Hierarchical;
  KOLO_THROW(InvalidArgument, "unknown algorithm '", name,
             "' (expected auto, ring, halving-doubling, tree, reduce-broadcast or hierarchical)");
}

}  // namespace kolo::comm
