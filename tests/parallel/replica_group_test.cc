// Tests of the in-process replica group: every reduction, op and dtype, with results in
// closed form (comm/closed_form.h), bit-identical replicas, and a replica that never arrives.
#include "kolo/parallel/replica_group.h"

#include <gtest/gtest.h>

#include <thread>
#include <vector>

#include "comm/closed_form.h"
#include "kolo/error.h"

namespace kolo::parallel {
namespace {

template <class Fn>
void onReplicas(int k, LocalReduction reduction, Fn fn) {
  auto comms = makeReplicaGroup(k, reduction, std::chrono::seconds(20));
  std::vector<std::thread> threads;
  std::vector<std::exception_ptr> errors(k);
  for (int r = 0; r < k; ++r) {
    threads.emplace_back([&, r] {
      try {
        fn(*comms[r]);
      } catch (...) {
        errors[r] = std::current_exception();
      }
    });
  }
  for (auto& t : threads) t.join();
  for (auto& e : errors)
    if (e) std::rethrow_exception(e);
}

class ReplicaGroupTest : public ::testing::TestWithParam<std::tuple<LocalReduction, int>> {};

TEST_P(ReplicaGroupTest, AllreduceSumAvgMaxClosedForm) {
  const auto [reduction, k] = GetParam();
  for (size_t count : {size_t{0}, size_t{1}, size_t{7}, size_t{1031}}) {
    std::vector<std::vector<double>> results(k);
    onReplicas(k, reduction, [&](comm::Communicator& c) {
      const int r = c.rank();
      // In place, f64 sum: element i of replica r is r + i, so the sum is k(k-1)/2 + k*i.
      std::vector<double> a(count);
      for (size_t i = 0; i < count; ++i) a[i] = r + static_cast<double>(i);
      c.allreduce(a.data(), a.data(), count, DType::F64, comm::ReduceOp::Sum);
      for (size_t i = 0; i < count; ++i)
        ASSERT_EQ(a[i], k * (k - 1) / 2.0 + k * static_cast<double>(i));
      results[r] = a;
      // Out of place, f32 avg.
      std::vector<float> in(count, static_cast<float>(2 * r)), out(count, -1.0f);
      c.allreduce(in.data(), out.data(), count, DType::F32, comm::ReduceOp::Avg);
      for (size_t i = 0; i < count; ++i) ASSERT_FLOAT_EQ(out[i], static_cast<float>(k - 1));
      for (size_t i = 0; i < count; ++i) ASSERT_EQ(in[i], static_cast<float>(2 * r));
      // i64 max.
      std::vector<int64_t> m(count, r * 10);
      c.allreduce(m.data(), m.data(), count, DType::I64, comm::ReduceOp::Max);
      for (size_t i = 0; i < count; ++i) ASSERT_EQ(m[i], (k - 1) * 10);
    });
    for (int r = 1; r < k; ++r) EXPECT_EQ(results[r], results[0]);
  }
}

TEST_P(ReplicaGroupTest, AllreduceEveryDtypeAndOpInClosedForm) {
  const auto [reduction, k] = GetParam();
  onReplicas(k, reduction, [&](comm::Communicator& c) {
    for (DType dtype : comm::detail::kAllDTypes)
      for (comm::ReduceOp op : comm::detail::kAllReduceOps)
        for (size_t count : {size_t{0}, size_t{1}, size_t{61}}) {
          std::vector<uint8_t> in(count * dtypeSize(dtype) + 1), out(in.size());
          comm::detail::fillClosedFormInput(in.data(), dtype, count, op, c.rank(), k);
          c.allreduce(in.data(), out.data(), count, dtype, op);
          const std::string wrong = comm::detail::closedFormMismatch(out.data(), dtype, count, op, k);
          ASSERT_TRUE(wrong.empty()) << localReductionName(reduction) << ": " << wrong;
        }
  });
}

TEST_P(ReplicaGroupTest, NonBlockingAllreducesCompleteInOrder) {
  const auto [reduction, k] = GetParam();
  onReplicas(k, reduction, [&](comm::Communicator& c) {
    std::vector<std::vector<float>> bufs(5, std::vector<float>(100));
    std::vector<std::unique_ptr<comm::Work>> works;
    for (int j = 0; j < 5; ++j) {
      std::fill(bufs[j].begin(), bufs[j].end(), static_cast<float>(j + c.rank()));
      works.push_back(
          c.iallreduce(bufs[j].data(), bufs[j].data(), 100, DType::F32, comm::ReduceOp::Sum));
    }
    works[4]->wait();  // completes the earlier ones too
    for (int j = 0; j < 5; ++j) {
      EXPECT_TRUE(works[j]->test());
      EXPECT_EQ(bufs[j][99], static_cast<float>(k * j + k * (k - 1) / 2));
    }
  });
}

TEST_P(ReplicaGroupTest, BroadcastAndAllgather) {
  const auto [reduction, k] = GetParam();
  onReplicas(k, reduction, [&](comm::Communicator& c) {
    std::vector<int32_t> b(9, c.rank() == k - 1 ? 42 : c.rank());
    c.broadcast(b.data(), b.size(), DType::I32, k - 1);
    for (int32_t v : b) EXPECT_EQ(v, 42);
    std::vector<double> mine(3, c.rank()), all(3 * k, -1);
    c.allgather(mine.data(), all.data(), 3, DType::F64);
    for (int r = 0; r < k; ++r)
      for (int i = 0; i < 3; ++i) EXPECT_EQ(all[r * 3 + i], r);
    c.barrier();
  });
}

INSTANTIATE_TEST_SUITE_P(All, ReplicaGroupTest,
                         ::testing::Combine(::testing::Values(LocalReduction::ReduceToOne,
                                                              LocalReduction::HierarchicalCopy,
                                                              LocalReduction::Ring),
                                            ::testing::Values(1, 2, 3, 4, 7)));

TEST(ReplicaGroup, MissingReplicaTimesOutNamingIt) {
  auto comms = makeReplicaGroup(3, LocalReduction::Ring, std::chrono::milliseconds(200));
  std::vector<std::string> messages(2);
  std::vector<std::thread> threads;
  for (int r = 0; r < 2; ++r) {
    threads.emplace_back([&, r] {
      float x = 1;
      try {
        comms[r]->allreduce(&x, &x, 1, DType::F32, comm::ReduceOp::Sum);
      } catch (const Timeout& e) {
        messages[r] = e.what();
      }
    });
  }
  for (auto& t : threads) t.join();
  for (const auto& m : messages)
    EXPECT_NE(m.find("replica(s) 2 did not arrive"), std::string::npos) << m;
}

TEST(ReplicaGroup, MismatchedCountsAreReported) {
  auto comms = makeReplicaGroup(2, LocalReduction::ReduceToOne, std::chrono::milliseconds(300));
  float a[4] = {};
  comms[0]->iallreduce(a, a, 4, DType::F32, comm::ReduceOp::Sum);
  EXPECT_THROW(comms[1]->iallreduce(a, a, 3, DType::F32, comm::ReduceOp::Sum), Mismatch);
}

TEST(ReplicaGroup, ParsesReductionNames) {
  EXPECT_EQ(parseLocalReduction("ring"), LocalReduction::Ring);
  EXPECT_EQ(parseLocalReduction("reduce-to-one"), LocalReduction::ReduceToOne);
  EXPECT_EQ(parseLocalReduction("hierarchical-copy"), LocalReduction::HierarchicalCopy);
  EXPECT_THROW(parseLocalReduction("nccl"), InvalidArgument);
}

}  // namespace
}  // namespace kolo::parallel
