// The data × model grid of hybrid runs and the data groups' gradient average.
#include "kolo/parallel/mesh.h"

#include <cstring>
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
    KOLO_REQUIRE(value >= 1 && (key == "dp" || key == "pp" || key == "tp"), "--mesh '", text,
                 "' is not accepted: use sizes such as dp=2,pp=2 or dp=2,tp=2");
    (key == "dp" ? shape.dp : key == "pp" ? shape.pp : shape.tp) = value;
    any = true;
  }
  KOLO_REQUIRE(any, "--mesh '", text, "' is not accepted: use sizes such as dp=2,pp=2 or dp=2,tp=2");
  KOLO_REQUIRE(shape.pp == 1 || shape.tp == 1, "--mesh '", text,
               "': data x pipeline x tensor is not built; use dp with pp or with tp");
  return shape;
}

MeshGroups makeMesh(comm::Communicator& world, const MeshShape& shape) {
  KOLO_REQUIRE(world.size() == shape.size(), "--mesh dp=", shape.dp, ",pp=", shape.pp, ",tp=", shape.tp,
               " needs ", shape.size(), " ranks, this job has ", world.size());
  const int m = shape.pp * shape.tp;
  MeshGroups groups;
  groups.replica = world.rank() / m;
  // Both splits are collective over every rank, in the same order everywhere.
  groups.model = world.split(groups.replica, world.rank());
  groups.data = world.split(world.rank() % m, world.rank());
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

}  // namespace kolo::parallel
