// The fsdp optimizer state between its two forms: per rank, one slice per parameter piece
// (what the sharded update keeps), and whole, per parameter, in the model's shapes (what a
// checkpoint holds, the same as one-device training's), so that a run resumes on any rank
// count.
#include <algorithm>
#include <cstring>

#include "fsdp_unit.h"
#include "kolo/error.h"

namespace kolo::parallel::detail {
namespace {

// A slot that holds one value for its whole parameter (Adam's step) rather than one per element.
bool isPerParameter(const Tensor& slot) { return slot.dim() == 0; }

// The optimizer's slots as the group's rank 0 holds them: their names, and whether each is
// per parameter. Rank 0 holds element 0 of every unit, so it has state wherever a step was
// taken; the other ranks may hold no piece of a parameter, or of a whole unit.
std::vector<std::pair<std::string, bool>> agreedSlots(const optim::StateDict& state,
                                                      comm::Communicator& group,
                                                      const comm::CollectiveOptions& options) {
  std::string text;  // "name=0|1;" per slot
  if (group.rank() == 0 && !state.perParameter.empty())
    for (const auto& [slot, tensor] : state.perParameter.begin()->second)
      text += slot + "=" + (isPerParameter(tensor) ? "1" : "0") + ";";
  int64_t length = static_cast<int64_t>(text.size());
  group.broadcast(&length, 1, DType::I64, 0, options);
  text.resize(static_cast<size_t>(length));
  group.broadcast(text.data(), text.size(), DType::U8, 0, options);
  std::vector<std::pair<std::string, bool>> slots;
  for (size_t at = 0; at < text.size();) {
    const size_t end = text.find(';', at);
    slots.emplace_back(text.substr(at, end - at - 2), text[end - 1] == '1');
    at = end + 1;
  }
  return slots;
}

}  // namespace

void assembleWholeState(const std::vector<FsdpUnit>& units, const std::vector<FsdpPiece>& pieces,
                        const optim::Optimizer& shards, optim::Optimizer& whole,
                        comm::Communicator& group, const comm::CollectiveOptions& options) {
  const optim::StateDict mine = shards.stateDict();
  const NamedTensors& pieceTensors = shards.parameters();
  const int64_t rank = group.rank();

  optim::StateDict state;
  state.scalars = mine.scalars;  // step count and learning rate: the same on every rank
  auto held = [&](size_t piece, const std::string& slot) -> const Tensor* {
    auto params = mine.perParameter.find(pieceTensors[piece].first);
    if (params == mine.perParameter.end()) return nullptr;
    auto it = params->second.find(slot);
    return it == params->second.end() ? nullptr : &it->second;
  };
  for (const auto& [slot, perParameter] : agreedSlots(mine, group, options)) {
    if (!perParameter) {
      // Per element: each rank writes its pieces into its shard of the unit; all-gather.
      for (size_t u = 0; u < units.size(); ++u) {
        const FsdpUnit& unit = units[u];
        Tensor shard = Tensor::zeros({unit.shardLength});
        for (size_t i = 0; i < pieces.size(); ++i) {
          const Tensor* values = pieces[i].unit == u ? held(i, slot) : nullptr;
          if (!values) continue;
          const Tensor flat = values->contiguous();
          std::memcpy(shard.data<float>() + (pieces[i].lo - rank * unit.shardLength),
                      flat.data<float>(), sizeof(float) * static_cast<size_t>(flat.numel()));
        }
        Tensor gathered = Tensor::empty({unit.padded});
        group.allgather(shard.data<float>(), gathered.data<float>(),
                        static_cast<size_t>(unit.shardLength), DType::F32, options);
        for (size_t p = 0; p < unit.parameters.size(); ++p) {
          const auto& [name, parameter] = unit.parameters[p];
          // Flat, as the optimizer keeps it on one device.
          state.perParameter[name][slot] =
              gathered.slice(0, unit.offsets[p], unit.offsets[p] + parameter.numel()).clone();
        }
      }
    } else {
      // Per parameter: the value of any rank holding a piece of it (they agree); the largest.
      std::vector<double> values;
      for (const FsdpUnit& unit : units) values.resize(values.size() + unit.parameters.size(), 0.0);
      std::vector<size_t> first(units.size(), 0);  // index of each unit's first parameter
      for (size_t u = 1; u < units.size(); ++u) first[u] = first[u - 1] + units[u - 1].parameters.size();
      for (size_t i = 0; i < pieces.size(); ++i)
        if (const Tensor* value = held(i, slot))
          values[first[pieces[i].unit] + pieces[i].parameter] = value->item();
      group.allreduce(values.data(), values.data(), values.size(), DType::F64, comm::ReduceOp::Max,
                      options);
      for (size_t u = 0; u < units.size(); ++u)
        for (size_t p = 0; p < units[u].parameters.size(); ++p)
          state.perParameter[units[u].parameters[p].first][slot] =
              Tensor::scalar(values[first[u] + p], DType::F64);
    }
  }
  whole.loadStateDict(state);
}

void takeShardState(std::vector<FsdpUnit>& units, const std::vector<FsdpPiece>& pieces,
                    const optim::Optimizer& whole, optim::Optimizer& shards, int rank) {
  for (FsdpUnit& unit : units) {
    KOLO_CHECK(unit.gathered && unit.flat->bytes, "fsdp: unit '", unit.name,
               "' is not gathered; call gatherModel() before loading into the model");
    std::memcpy(unit.shard.data<float>(),
                reinterpret_cast<const float*>(unit.flat->bytes.get()) + rank * unit.shardLength,
                sizeof(float) * static_cast<size_t>(unit.shardLength));
  }
  const optim::StateDict state = whole.stateDict();
  optim::StateDict mine;
  mine.scalars = state.scalars;
  const NamedTensors& pieceTensors = shards.parameters();
  for (size_t i = 0; i < pieces.size(); ++i) {
    const std::string& name = pieceTensors[i].first;
    auto it = state.perParameter.find(name);
    if (it == state.perParameter.end()) continue;
    const int64_t offset = units[pieces[i].unit].offsets[pieces[i].parameter];
    for (const auto& [slot, tensor] : it->second) {
      mine.perParameter[name][slot] =
          isPerParameter(tensor)
              ? tensor
              : tensor.reshape({tensor.numel()}).slice(0, pieces[i].lo - offset, pieces[i].hi - offset);
    }
  }
  shards.loadStateDict(mine);  // copies what it keeps
}

}  // namespace kolo::parallel::detail
