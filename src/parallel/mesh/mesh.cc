// The data × pipeline × tensor grid of hybrid runs, the data groups' gradient average, and
// the whole model gathered from a model group's parts.
//
// Protocol of gatherWholeTensors, from each rank but the root to the root (tag kGatherTag):
//   count (1 i64), then per piece: header (kHeaderWords i64: name bytes, dtype, spec dim,
//   spec blocks, ndim, dims...), the name (u8), the data (contiguous).
// broadcastTensors, from the root to every rank: the count, then per tensor the same header
// and name, then its data, each as a broadcast.
#include "kolo/parallel/mesh.h"

#include <cstring>
#include <map>
#include <sstream>

#include "kolo/error.h"

namespace kolo::parallel {

MeshShape parseMeshShape(const std::string& text) {
  MeshShape shape;
  std::stringstream in(text);
  std::string item;
  bool any = false;
  while (std::getline(in, item, ',')) {
    const size_t eq = item.find('=');
    int value = 0;
    try {
      size_t used = 0;
      value = eq == std::string::npos ? 0 : std::stoi(item.substr(eq + 1), &used);
      if (eq != std::string::npos && used != item.size() - eq - 1) value = 0;
    } catch (const std::exception&) {
      value = 0;
    }
    const std::string key = item.substr(0, eq);
    KOLO_REQUIRE(value >= 1 && (key == "dp" || key == "pp" || key == "tp"), "parseMeshShape '", text,
                 "' is not accepted: use sizes such as dp=2,pp=2,tp=2");
    (key == "dp" ? shape.dp : key == "pp" ? shape.pp : shape.tp) = value;
    any = true;
  }
  KOLO_REQUIRE(any, "parseMeshShape '", text, "' is not accepted: use sizes such as dp=2,pp=2,tp=2");
  return shape;
}

std::vector<int> parseSplitPoints(const std::string& text) {
  std::vector<int> splits;
  std::stringstream in(text + ",");  // so that a trailing comma leaves an empty word
  for (std::string word; std::getline(in, word, ',');) {
    size_t used = 0;
    try {
      splits.push_back(std::stoi(word, &used));
    } catch (const std::exception&) {
      used = 0;
    }
    KOLO_REQUIRE(used > 0 && used == word.size(), "parseSplitPoints '", text,
                 "' is not accepted: use layer indices such as 3,6");
  }
  return splits;
}

MeshGroups makeMesh(comm::Communicator& world, const MeshShape& shape) {
  KOLO_REQUIRE(world.size() == shape.size(), "MeshShape dp=", shape.dp, ",pp=", shape.pp, ",tp=", shape.tp,
               " needs ", shape.size(), " ranks, this job has ", world.size());
  const int m = shape.pp * shape.tp, rank = world.rank();
  MeshGroups groups;
  groups.replica = rank / m;
  groups.stage = rank % m / shape.tp;
  groups.tensorRank = rank % shape.tp;
  // Every split is collective over every rank, in the same order everywhere.
  groups.model = world.split(groups.replica, rank);
  groups.data = world.split(rank % m, rank);
  groups.pipeline = world.split(groups.replica * shape.tp + groups.tensorRank, groups.stage);
  groups.tensor = world.split(groups.replica * shape.pp + groups.stage, groups.tensorRank);
  return groups;
}

void averageGradients(const nn::Module& module, comm::Communicator& data) {
  if (data.size() == 1) return;
  const auto params = module.namedParameters();
  int64_t total = 0;
  for (const auto& entry : params) total += entry.second.numel();
  std::vector<float> packed(static_cast<size_t>(total), 0.0f);
  size_t at = 0;
  for (const auto& [name, p] : params) {
    KOLO_CHECK(p.dtype() == DType::F32, "averageGradients: ", name, " is not f32");
    const Tensor g = p.grad();
    if (g.defined()) {
      const Tensor c = g.contiguous();
      std::memcpy(packed.data() + at, c.data<float>(), static_cast<size_t>(c.numel()) * sizeof(float));
    }
    at += static_cast<size_t>(p.numel());
  }
  data.allreduce(packed.data(), packed.data(), packed.size(), DType::F32, comm::ReduceOp::Avg);
  at = 0;
  for (const auto& [name, p] : params) {
    Tensor g = p.grad();
    if (!g.defined()) {
      Tensor zeros = Tensor::zeros(p.shape(), p.dtype());
      Tensor(p).setGrad(zeros);
      g = p.grad();
    }
    KOLO_CHECK(g.isContiguous(), "averageGradients: the gradient of ", name, " is not contiguous");
    std::memcpy(g.data<float>(), packed.data() + at, static_cast<size_t>(p.numel()) * sizeof(float));
    at += static_cast<size_t>(p.numel());
  }
}

namespace {

constexpr int kGatherTag = 7290;
constexpr int kHeaderWords = 12;
constexpr int kMaxDims = kHeaderWords - 5;

void sendPieces(comm::Communicator& group, const std::vector<ModelPiece>& pieces, int root) {
  int64_t count = static_cast<int64_t>(pieces.size());
  group.send(&count, 1, DType::I64, root, kGatherTag);
  for (const ModelPiece& piece : pieces) {
    const Tensor data = piece.tensor.detach().contiguous();
    KOLO_CHECK(data.dim() <= kMaxDims, "gatherWholeTensors: ", piece.name, " has ", data.dim(),
               " dimensions");
    std::vector<int64_t> header(kHeaderWords, 0);
    header[0] = static_cast<int64_t>(piece.name.size());
    header[1] = static_cast<int64_t>(data.dtype());
    header[2] = piece.spec.dim;
    header[3] = piece.spec.blocks;
    header[4] = data.dim();
    for (int64_t d = 0; d < data.dim(); ++d)
      header[static_cast<size_t>(5 + d)] = data.shape()[static_cast<size_t>(d)];
    group.send(header.data(), header.size(), DType::I64, root, kGatherTag);
    group.send(piece.name.data(), piece.name.size(), DType::U8, root, kGatherTag);
    group.send(data.rawData(), static_cast<size_t>(data.numel()), data.dtype(), root, kGatherTag);
  }
}

std::vector<ModelPiece> receivePieces(comm::Communicator& group, int from) {
  int64_t count = 0;
  group.recv(&count, 1, DType::I64, from, kGatherTag);
  KOLO_REQUIRE(count >= 0 && count <= (int64_t{1} << 24), "gatherWholeTensors: rank ", from,
               " announced ", count, " pieces");
  std::vector<ModelPiece> pieces(static_cast<size_t>(count));
  for (ModelPiece& piece : pieces) {
    std::vector<int64_t> header(kHeaderWords, 0);
    group.recv(header.data(), header.size(), DType::I64, from, kGatherTag);
    const int64_t ndim = header[4];
    KOLO_REQUIRE(header[0] > 0 && header[0] <= 4096 && header[1] >= 0 &&
                     header[1] <= static_cast<int64_t>(DType::U8) && ndim >= 0 && ndim <= kMaxDims,
                 "gatherWholeTensors: bad piece header from rank ", from);
    Shape shape(header.begin() + 5, header.begin() + 5 + ndim);
    for (int64_t d : shape)
      KOLO_REQUIRE(d >= 0 && d <= (int64_t{1} << 40), "gatherWholeTensors: dimension ", d,
                   " from rank ", from);
    piece.name.assign(static_cast<size_t>(header[0]), '\0');
    group.recv(piece.name.data(), piece.name.size(), DType::U8, from, kGatherTag);
    piece.spec = {static_cast<int>(header[2]), static_cast<int>(header[3])};
    piece.tensor = Tensor::empty(shape, static_cast<DType>(header[1]));
    group.recv(piece.tensor.rawData(), static_cast<size_t>(piece.tensor.numel()),
               piece.tensor.dtype(), from, kGatherTag);
  }
  return pieces;
}

}  // namespace

std::vector<std::pair<std::string, Tensor>> gatherWholeTensors(
    comm::Communicator& group, const std::vector<ModelPiece>& pieces, int root) {
  if (group.rank() != root) {
    sendPieces(group, pieces, root);
    return {};
  }
  // Pieces by name, in rank order; names in the order they first appear.
  std::vector<std::string> order;
  std::map<std::string, std::vector<ModelPiece>> byName;
  for (int r = 0; r < group.size(); ++r) {
    std::vector<ModelPiece> held = r == root ? pieces : receivePieces(group, r);
    for (ModelPiece& piece : held) {
      auto& same = byName[piece.name];
      if (same.empty()) order.push_back(piece.name);
      same.push_back(std::move(piece));
    }
  }
  std::vector<std::pair<std::string, Tensor>> whole;
  for (const std::string& name : order) {
    const std::vector<ModelPiece>& same = byName.at(name);
    const ShardSpec spec = same.front().spec;
    if (spec.dim < 0) {
      whole.emplace_back(name, same.front().tensor.detach().contiguous().clone());
      continue;
    }
    std::vector<Tensor> parts;
    for (const ModelPiece& piece : same) parts.push_back(piece.tensor);
    whole.emplace_back(name, unshardTensor(parts, spec.dim, spec.blocks));
  }
  return whole;
}

std::vector<std::pair<std::string, Tensor>> broadcastTensors(
    comm::Communicator& comm, const std::vector<std::pair<std::string, Tensor>>& tensors,
    int root) {
  const bool sender = comm.rank() == root;
  int64_t count = sender ? static_cast<int64_t>(tensors.size()) : 0;
  comm.broadcast(&count, 1, DType::I64, root);
  KOLO_REQUIRE(count >= 0 && count <= (int64_t{1} << 24), "broadcastTensors: rank ", root,
               " announced ", count, " tensors");
  std::vector<std::pair<std::string, Tensor>> out(static_cast<size_t>(count));
  for (int64_t i = 0; i < count; ++i) {
    auto& [name, tensor] = out[static_cast<size_t>(i)];
    std::vector<int64_t> header(kHeaderWords, 0);
    if (sender) {
      name = tensors[static_cast<size_t>(i)].first;
      tensor = tensors[static_cast<size_t>(i)].second.detach().contiguous();
      KOLO_CHECK(tensor.dim() <= kMaxDims, "broadcastTensors: ", name, " has ", tensor.dim(),
                 " dimensions");
      header[0] = static_cast<int64_t>(name.size());
      header[1] = static_cast<int64_t>(tensor.dtype());
      header[4] = tensor.dim();
      for (int64_t d = 0; d < tensor.dim(); ++d)
        header[static_cast<size_t>(5 + d)] = tensor.shape()[static_cast<size_t>(d)];
    }
    comm.broadcast(header.data(), header.size(), DType::I64, root);
    const int64_t ndim = header[4];
    KOLO_REQUIRE(header[0] > 0 && header[0] <= 4096 && header[1] >= 0 &&
                     header[1] <= static_cast<int64_t>(DType::U8) && ndim >= 0 && ndim <= kMaxDims,
                 "broadcastTensors: bad tensor header from rank ", root);
    if (!sender) {
      Shape shape(header.begin() + 5, header.begin() + 5 + ndim);
      for (int64_t d : shape)
        KOLO_REQUIRE(d >= 0 && d <= (int64_t{1} << 40), "broadcastTensors: dimension ", d,
                     " from rank ", root);
      name.assign(static_cast<size_t>(header[0]), '\0');
      tensor = Tensor::empty(shape, static_cast<DType>(header[1]));
    }
    comm.broadcast(name.data(), name.size(), DType::U8, root);
    comm.broadcast(tensor.rawData(), static_cast<size_t>(tensor.numel()), tensor.dtype(), root);
  }
  return out;
}

Tensor pieceOfWhole(const Tensor& whole, const ShardSpec& spec, int rank, int parts) {
  if (spec.dim < 0) return whole;
  return shardTensor(whole, spec.dim, spec.blocks, rank, parts);
}

}  // namespace kolo::parallel
