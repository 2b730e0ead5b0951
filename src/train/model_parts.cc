// The pieces of a model part, the whole state broadcast to every rank and cut back into
// parts, and the agreement of the ranks on whether they could load it.
#include "train/model_parts.h"

#include <cstring>

#include "kolo/error.h"

namespace kolo::train::detail {
namespace {

constexpr const char* kKindName = "optimizer_kind";
constexpr const char* kScalarPrefix = "scalar/";

parallel::ShardSpec specOf(const ShardSpecs& specs, const std::string& name) {
  const auto found = specs.find(name);
  return found == specs.end() ? parallel::ShardSpec{} : found->second;
}

std::map<std::string, Shape> parameterShapes(nn::Module& module) {
  std::map<std::string, Shape> shapes;
  for (const auto& [name, t] : module.namedParameters()) shapes[name] = t.shape();
  return shapes;
}

const Tensor* findTensor(const NamedTensors& tensors, const std::string& name) {
  for (const auto& entry : tensors)
    if (entry.first == name) return &entry.second;
  return nullptr;
}

const Tensor& wholeTensor(const NamedTensors& tensors, const std::string& name) {
  const Tensor* found = findTensor(tensors, name);
  if (!found) KOLO_THROW(Mismatch, "checkpoint: it has no tensor ", name, ", which this model holds");
  return *found;
}

Tensor bytesTensor(const std::string& text) {
  Tensor t = Tensor::empty({static_cast<int64_t>(text.size())}, DType::U8);
  if (!text.empty()) std::memcpy(t.rawData(), text.data(), text.size());
  return t;
}

}  // namespace

std::vector<parallel::ModelPiece> weightPieces(nn::Module& module, const ShardSpecs& specs) {
  std::vector<parallel::ModelPiece> pieces;
  for (const auto& [name, t] : module.stateDict()) pieces.push_back({name, t, specOf(specs, name)});
  return pieces;
}

std::vector<parallel::ModelPiece> optimizerPieces(nn::Module& module, const optim::StateDict& state,
                                                  const ShardSpecs& specs) {
  const std::map<std::string, Shape> shapes = parameterShapes(module);
  std::vector<parallel::ModelPiece> pieces;
  for (const auto& [name, slots] : state.perParameter) {
    const Shape& shape = shapes.at(name);
    for (const auto& [slot, t] : slots) {
      const bool companion = t.numel() == shapeNumel(shape);
      pieces.push_back({name + "/" + slot, companion ? t.reshape(shape) : t,
                        companion ? specOf(specs, name) : parallel::ShardSpec{}});
    }
  }
  return pieces;
}

NamedTensors gatherPieces(comm::Communicator* group, const std::vector<parallel::ModelPiece>& pieces) {
  if (group) return parallel::gatherWholeTensors(*group, pieces, 0);
  NamedTensors whole;
  for (const auto& piece : pieces) whole.emplace_back(piece.name, piece.tensor);
  return whole;
}

WholeState broadcastWholeState(comm::Communicator& comm, const WholeState& state) {
  // The kind and the scalars travel as tensors of their own list.
  NamedTensors meta;
  if (comm.rank() == 0) {
    meta.emplace_back(kKindName, bytesTensor(state.optimizerKind));
    for (const auto& [key, value] : state.optimizer.scalars)
      meta.emplace_back(kScalarPrefix + key, Tensor::full({1}, value, DType::F64));
  }
  meta = parallel::broadcastTensors(comm, meta, 0);
  WholeState out;
  out.weights = parallel::broadcastTensors(comm, state.weights, 0);
  const NamedTensors slots = parallel::broadcastTensors(comm, state.optimizer.flatTensors(), 0);
  std::map<std::string, double> scalars;
  for (const auto& [name, t] : meta) {
    if (name == kKindName) {
      out.optimizerKind.assign(static_cast<const char*>(t.rawData()), static_cast<size_t>(t.numel()));
    } else if (name.rfind(kScalarPrefix, 0) == 0 && t.dtype() == DType::F64 && t.numel() == 1) {
      scalars[name.substr(std::strlen(kScalarPrefix))] = *static_cast<const double*>(t.rawData());
    }
  }
  out.optimizer = optim::StateDict::fromFlat(slots, std::move(scalars));
  return out;
}

void loadPart(const WholeState& whole, const PartShape& part) {
  // Weights: this rank's piece of every tensor it holds.
  for (const auto& [name, mine] : part.module->stateDict()) {
    const Tensor piece = parallel::pieceOfWhole(wholeTensor(whole.weights, name),
                                                specOf(part.specs, name), part.tensorRank, part.parts);
    if (piece.shape() != mine.shape())
      KOLO_THROW(Mismatch, "checkpoint: ", name, " gives ", shapeString(piece.shape()),
                 " for this rank, which holds ", shapeString(mine.shape()));
    Tensor(mine).copyFrom(piece);
  }
  // The optimizer state of those parameters, cut alike.
  if (whole.optimizerKind != part.optimizer->kind())
    KOLO_THROW(Mismatch, "checkpoint: it holds ",
               whole.optimizerKind.empty() ? "no" : whole.optimizerKind,
               " optimizer state, this run's optimizer is ", part.optimizer->kind());
  optim::StateDict local;
  local.scalars = whole.optimizer.scalars;
  for (const auto& [name, shape] : parameterShapes(*part.module)) {
    auto slots = whole.optimizer.perParameter.find(name);
    for (const parallel::TiedParameter& tie : part.ties) {
      if (slots != whole.optimizer.perParameter.end()) break;
      if (tie.first == name || tie.second == name)
        slots = whole.optimizer.perParameter.find(tie.first == name ? tie.second : tie.first);
    }
    if (slots == whole.optimizer.perParameter.end()) continue;
    const Tensor& full = wholeTensor(whole.weights, name);
    for (const auto& [slot, t] : slots->second) {
      local.perParameter[name][slot] =
          t.numel() == full.numel()
              ? parallel::pieceOfWhole(t.reshape(full.shape()), specOf(part.specs, name),
                                       part.tensorRank, part.parts)
              : t;
    }
  }
  part.optimizer->loadStateDict(local);
}

void agreeLoaded(comm::Communicator* comm, const std::exception_ptr& problem, const std::string& what) {
  if (!comm || comm->size() == 1) {
    if (problem) std::rethrow_exception(problem);
    return;
  }
  // The lowest rank that failed (size: none).
  int64_t failed = problem ? comm->rank() : comm->size();
  comm->allreduce(&failed, &failed, 1, DType::I64, comm::ReduceOp::Min);
  if (problem) std::rethrow_exception(problem);
  if (failed < comm->size())
    KOLO_THROW(Mismatch, "rank ", comm->rank(), ": rank ", failed, " could not load ", what);
}

void onRoot(comm::Communicator* comm, const std::string& what, const std::function<void()>& work) {
  const int rank = comm ? comm->rank() : 0;
  int64_t ok = 1;
  std::exception_ptr problem;
  if (rank == 0) {
    try {
      work();
    } catch (const Error&) {
      ok = 0;
      problem = std::current_exception();
    }
  }
  if (comm && comm->size() > 1) comm->broadcast(&ok, 1, DType::I64, 0);
  if (problem) std::rethrow_exception(problem);
  if (ok == 0) KOLO_THROW(PeerError, "rank ", rank, ": rank 0 failed in ", what);
}

}  // namespace kolo::train::detail
