// Hybrids: 4 ranks as threads split into 2 data-parallel replicas × 2 pipeline stages, and
// 2 replicas × 2 tensor-parallel ranks; each replica trains on its half of every batch and the
// data groups average gradients. After 10 SGD steps the losses and weights equal one rank's on
// the whole batch (1e-5 of the largest value). Mesh texts that are not accepted are named.
#include <gtest/gtest.h>

#include "kolo/parallel/mesh.h"
#include "kolo/parallel/tensor_parallel.h"
#include "pipeline_harness.h"

namespace kolo::parallel {
namespace {
using namespace testing;

constexpr int kSteps = 10;

std::shared_ptr<nn::Sequential> meshModel() {
  Generator gen(321);
  return nn::makeLanguageModel({.vocab = 24, .layers = 2, .dModel = 16, .heads = 4, .seqLen = 6}, gen);
}

PipeResult unsplit() {
  auto m = meshModel();
  auto optimizer = pipeOptimizer(m->namedParameters());
  PipeResult result;
  for (int s = 0; s < kSteps; ++s) {
    auto [x, y] = pipeBatch("lm", s);
    optimizer->zeroGrad();
    Tensor l = pipeLoss("lm")(m->forward(x), y);
    l.backward();
    optimizer->step();
    result.losses.push_back(l.item());
  }
  result.state = m->stateDict();
  return result;
}

// Rows of replica d of the global batch.
Tensor half(const Tensor& t, int replica) {
  const int64_t rows = t.shape()[0] / 2;
  return t.slice(0, replica * rows, (replica + 1) * rows).contiguous();
}

PipeResult hybrid(const MeshShape& shape) {
  auto commFor = nativeRanks(shape.size());
  auto whole = meshModel();
  std::vector<std::vector<double>> losses(static_cast<size_t>(shape.size()));
  runThreads(shape.size(), [&](int rank) {
    auto world = commFor(rank);
    const MeshGroups mesh = makeMesh(*world, shape);
    auto record = [&](double loss) {
      double mean = loss;
      mesh.data->allreduce(&mean, &mean, 1, DType::F64, comm::ReduceOp::Avg);
      losses[static_cast<size_t>(rank)].push_back(mean);
    };
    if (shape.pp > 1) {
      PipelineStage stage(mesh.model, *meshModel(), {3}, {.microBatches = 2}, pipeLoss("lm"), pipeOptimizer);
      for (int s = 0; s < kSteps; ++s) {
        auto [x, y] = pipeBatch("lm", s);
        stage.optimizer().zeroGrad();
        const PipelineStepStats stats = stage.forwardBackward(half(x, mesh.replica), half(y, mesh.replica));
        averageGradients(stage.module(), *mesh.data);
        stage.optimizer().step();
        record(stats.loss);
      }
      if (mesh.replica == 0) stage.gatherModel(rank == 0 ? whole.get() : nullptr, 0);
    } else {
      TensorParallelModel tp(*meshModel(), mesh.model);
      auto optimizer = pipeOptimizer(tp.namedParameters());
      for (int s = 0; s < kSteps; ++s) {
        auto [x, y] = pipeBatch("lm", s);
        optimizer->zeroGrad();
        Tensor l = pipeLoss("lm")(tp.forward(half(x, mesh.replica)), half(y, mesh.replica));
        l.backward();
        averageGradients(tp, *mesh.data);
        optimizer->step();
        record(l.item());
      }
      if (mesh.replica == 0) tp.gatherInto(rank == 0 ? whole.get() : nullptr, 0);
    }
  });
  for (int r = 1; r < shape.size(); ++r)
    if (losses[static_cast<size_t>(r)] != losses[0]) ADD_FAILURE() << "rank " << r << " reports other losses";
  PipeResult result;
  result.losses = losses[0];
  result.state = whole->stateDict();
  return result;
}

TEST(Mesh, DataTimesPipelineMatchesOneRank) {
  const PipeResult want = unsplit();
  const PipeResult got = hybrid({.dp = 2, .pp = 2});
  EXPECT_LT(maxRelDiff(got.losses, want.losses), 1e-5);
  EXPECT_LT(maxRelDiff(stateValues(got.state), stateValues(want.state)), 1e-5);
  EXPECT_GT(want.losses[0] - want.losses[kSteps - 2], 0.02) << "the reference does not learn";
}

TEST(Mesh, DataTimesTensorMatchesOneRank) {
  const PipeResult want = unsplit();
  const PipeResult got = hybrid({.dp = 2, .tp = 2});
  EXPECT_LT(maxRelDiff(got.losses, want.losses), 1e-5);
  EXPECT_LT(maxRelDiff(stateValues(got.state), stateValues(want.state)), 1e-5);
}

TEST(Mesh, ShapesAreParsedOrNamed) {
  const MeshShape shape = parseMeshShape("dp=2,pp=3");
  EXPECT_EQ(shape.dp, 2);
  EXPECT_EQ(shape.pp, 3);
  EXPECT_EQ(shape.tp, 1);
  EXPECT_EQ(parseMeshShape("tp=4").size(), 4);
  for (const char* bad : {"dp=0", "xp=2", "dp=2,pp=2,tp=2", "dp=two", ""}) {
    try {
      parseMeshShape(bad);
      ADD_FAILURE() << bad << " was accepted";
    } catch (const InvalidArgument& e) {
      EXPECT_NE(std::string(e.what()).find("--mesh"), std::string::npos) << e.what();
    }
  }
}

}  // namespace
}  // namespace kolo::parallel
