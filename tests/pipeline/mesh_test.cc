// Hybrids: ranks as threads split into 2 data-parallel replicas × 2 pipeline stages, 2
// replicas × 2 tensor-parallel ranks, 2 × 2 × 2 (stages split over tensor groups, with and
// without sequence parallelism) and 1 × 2 × 2; each replica trains on its share of every batch
// and the data groups average gradients. After 10 SGD steps the losses and weights (gathered
// from the parts with gatherWholeTensors) equal one rank's on the whole batch (1e-5 of the
// largest value). broadcastTensors gives every rank the root's tensors. Mesh texts that are
// not accepted are named.
#include "kolo/parallel/mesh.h"

#include <gtest/gtest.h>

#include "kolo/parallel/tensor_parallel.h"
#include "kolo/safetensors.h"
#include "pipeline_harness.h"

namespace kolo::parallel {
namespace {
using namespace testing;

// Prints a measured difference (the figures docs/model_parallel.md quotes) and returns it.
double report(double difference, const char* what) {
  std::printf("    largest relative difference of the %s: %.2g\n", what, difference);
  return difference;
}

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

// Rows of replica d of dp of the global batch.
Tensor share(const Tensor& t, int replica, int dp) {
  const int64_t rows = t.shape()[0] / dp;
  return t.slice(0, replica * rows, (replica + 1) * rows).contiguous();
}

// This rank's parameters as pieces of the whole model.
std::vector<ModelPiece> piecesOf(const nn::Module& module,
                                 const std::map<std::string, ShardSpec>& specs) {
  std::vector<ModelPiece> pieces;
  for (const auto& [name, t] : module.stateDict()) {
    const auto spec = specs.find(name);
    pieces.push_back({name, t, spec == specs.end() ? ShardSpec{} : spec->second});
  }
  return pieces;
}

PipeResult hybrid(const MeshShape& shape, bool sequenceParallel = false) {
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
    std::shared_ptr<nn::Sequential> model = meshModel();
    std::map<std::string, ShardSpec> specs;
    std::shared_ptr<TensorParallelModel> tp;
    if (shape.tp > 1) {
      TensorParallelPlan plan = defaultPlan(*model);
      plan.sequenceParallel = sequenceParallel;
      tp = std::make_shared<TensorParallelModel>(model, mesh.tensor, plan,
                                                 shape.pp > 1 ? mesh.pipeline.get() : nullptr);
      specs = tp->shardSpecs();
    }
    const nn::Module* trained = model.get();
    std::unique_ptr<PipelineStage> stage;
    if (shape.pp > 1) {
      StageLossFn loss =
          tp ? StageLossFn([tp](const Tensor& o, const Tensor& y) { return tp->loss(o, y); })
             : pipeLoss("lm");
      stage =
          std::make_unique<PipelineStage>(mesh.pipeline, *model, std::vector<int>{3},
                                          PipelineOptions{.microBatches = 2}, loss, pipeOptimizer);
      for (int s = 0; s < kSteps; ++s) {
        auto [x, y] = pipeBatch("lm", s);
        stage->optimizer().zeroGrad();
        const PipelineStepStats stats = stage->forwardBackward(share(x, mesh.replica, shape.dp),
                                                               share(y, mesh.replica, shape.dp));
        if (tp) tp->synchronizeGradients();
        averageGradients(stage->module(), *mesh.data);
        stage->optimizer().step();
        record(stats.loss);
      }
      trained = &stage->module();
    } else {
      auto optimizer = pipeOptimizer(tp->module().namedParameters());
      for (int s = 0; s < kSteps; ++s) {
        auto [x, y] = pipeBatch("lm", s);
        optimizer->zeroGrad();
        Tensor l = tp->loss(tp->forward(share(x, mesh.replica, shape.dp)),
                            share(y, mesh.replica, shape.dp));
        l.backward();
        tp->synchronizeGradients();
        averageGradients(tp->module(), *mesh.data);
        optimizer->step();
        record(l.item());
      }
    }
    if (mesh.replica != 0) return;
    const auto gathered = gatherWholeTensors(*mesh.model, piecesOf(*trained, specs));
    if (rank == 0) checkpoint::copyIntoTensors({gathered, {}}, whole->stateDict());
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
  EXPECT_LT(report(maxRelDiff(got.losses, want.losses), "losses"), 1e-5);
  EXPECT_LT(report(maxRelDiff(stateValues(got.state), stateValues(want.state)), "weights"), 1e-5);
  EXPECT_GT(want.losses[0] - want.losses[kSteps - 2], 0.02) << "the reference does not learn";
}

TEST(Mesh, DataTimesTensorMatchesOneRank) {
  const PipeResult want = unsplit();
  const PipeResult got = hybrid({.dp = 2, .tp = 2});
  EXPECT_LT(report(maxRelDiff(got.losses, want.losses), "losses"), 1e-5);
  EXPECT_LT(report(maxRelDiff(stateValues(got.state), stateValues(want.state)), "weights"), 1e-5);
}

TEST(Mesh, DataTimesPipelineTimesTensorMatchesOneRank) {
  const PipeResult want = unsplit();
  for (const MeshShape shape :
       {MeshShape{.dp = 2, .pp = 2, .tp = 2}, MeshShape{.dp = 1, .pp = 2, .tp = 2}}) {
    for (bool sequenceParallel : {false, true}) {
      if (sequenceParallel && shape.dp == 1) continue;
      const PipeResult got = hybrid(shape, sequenceParallel);
      EXPECT_LT(report(maxRelDiff(got.losses, want.losses), "losses"), 1e-5)
          << shape.dp << "x2x2 sp " << sequenceParallel;
      EXPECT_LT(report(maxRelDiff(stateValues(got.state), stateValues(want.state)), "weights"),
                1e-5)
          << shape.dp << "x2x2 sp " << sequenceParallel;
    }
  }
}

TEST(Mesh, GroupsFollowTheRankLayout) {
  auto commFor = nativeRanks(8);
  runThreads(8, [&](int rank) {
    const MeshGroups mesh = makeMesh(*commFor(rank), {.dp = 2, .pp = 2, .tp = 2});
    // w = d·4 + s·2 + t
    EXPECT_EQ(mesh.replica, rank / 4);
    EXPECT_EQ(mesh.stage, rank / 2 % 2);
    EXPECT_EQ(mesh.tensorRank, rank % 2);
    EXPECT_EQ(mesh.model->size(), 4);
    EXPECT_EQ(mesh.model->rank(), rank % 4);
    EXPECT_EQ(mesh.pipeline->rank(), mesh.stage);
    EXPECT_EQ(mesh.tensor->rank(), mesh.tensorRank);
    EXPECT_EQ(mesh.data->rank(), mesh.replica);
    // Each group sums its members' world ranks.
    auto sumOver = [&](comm::Communicator& group) {
      int64_t v = rank;
      group.allreduce(&v, &v, 1, DType::I64, comm::ReduceOp::Sum);
      return v;
    };
    const int d = rank / 4, s = rank / 2 % 2, t = rank % 2;
    EXPECT_EQ(sumOver(*mesh.tensor), 2 * (d * 4 + s * 2) + 1);
    EXPECT_EQ(sumOver(*mesh.pipeline), 2 * (d * 4 + t) + 2);
    EXPECT_EQ(sumOver(*mesh.data), 2 * (s * 2 + t) + 4);
  });
}

// broadcastTensors: every rank ends with the root's names, shapes, dtypes and values (an
// empty tensor included), whatever it passed itself.
TEST(Mesh, BroadcastTensorsGivesEveryRankTheRootsTensors) {
  const int n = 3, root = 1;
  auto connect = nativeRanks(n);
  std::vector<std::vector<std::pair<std::string, Tensor>>> got(n);
  runThreads(n, [&](int rank) {
    std::vector<std::pair<std::string, Tensor>> mine = {{"ignored", Tensor::zeros({2})}};
    if (rank == root) {
      Generator gen(5);
      mine = {{"0.weight", Tensor::randn({3, 4}, gen)},
              {"1.ids", Tensor::fromVector({2}, std::vector<int64_t>{7, -9})},
              {"empty", Tensor::zeros({0, 5})}};
    }
    got[static_cast<size_t>(rank)] = broadcastTensors(*connect(rank), mine, root);
  });
  for (int r = 0; r < n; ++r) {
    const auto& tensors = got[static_cast<size_t>(r)];
    ASSERT_EQ(tensors.size(), 3u) << "rank " << r;
    for (size_t i = 0; i < tensors.size(); ++i) {
      const auto& expected = got[root][i];
      EXPECT_EQ(tensors[i].first, expected.first) << "rank " << r;
      EXPECT_EQ(tensors[i].second.shape(), expected.second.shape()) << "rank " << r;
      EXPECT_EQ(tensors[i].second.dtype(), expected.second.dtype()) << "rank " << r;
      EXPECT_EQ(tensors[i].second.toFloatVector(), expected.second.toFloatVector()) << "rank " << r;
    }
  }
  EXPECT_EQ(got[0][1].second.toFloatVector(), (std::vector<float>{7.0f, -9.0f}));
}

TEST(Mesh, ShapesAreParsedOrNamed) {
  const MeshShape shape = parseMeshShape("dp=2,pp=3");
  EXPECT_EQ(shape.dp, 2);
  EXPECT_EQ(shape.pp, 3);
  EXPECT_EQ(shape.tp, 1);
  EXPECT_EQ(parseMeshShape("tp=4").size(), 4);
  EXPECT_EQ(parseMeshShape("dp=2,pp=2,tp=2").size(), 8);
  for (const char* bad : {"dp=0", "xp=2", "dp=two", ""}) {
    try {
      parseMeshShape(bad);
      ADD_FAILURE() << bad << " was accepted";
    } catch (const InvalidArgument& e) {
      EXPECT_NE(std::string(e.what()).find("parseMeshShape"), std::string::npos) << e.what();
    }
  }
}

TEST(Mesh, SplitPointsAreParsed) {
  EXPECT_EQ(parseSplitPoints("3,6"), (std::vector<int>{3, 6}));
  EXPECT_EQ(parseSplitPoints("2"), (std::vector<int>{2}));
  for (const char* bad : {"1,x", "3,,6", "2.5", "3,"}) {
    try {
      parseSplitPoints(bad);
      ADD_FAILURE() << bad << " was accepted";
    } catch (const InvalidArgument& e) {
      EXPECT_NE(std::string(e.what()).find(std::string("'") + bad + "' is not accepted"), std::string::npos)
          << e.what();
    }
  }
}

}  // namespace
}  // namespace kolo::parallel
