// ElasticContext with ranks as threads over one memory store: survivors agree on the next
// generation (members, lost ranks, the least completed step) and their new communicator
// works; a rank that comes back late, still in the old generation, is refused; fewer
// members than the minimum is an error naming the lost rank; a joiner is admitted at a step
// boundary and the late rank is still refused.
#include "parallel/elastic/store_keys.h"
#include "kolo/parallel/elastic.h"

#include <gtest/gtest.h>

#include <functional>
#include <string>
#include <thread>
#include <vector>

#include "kolo/comm/stores.h"
#include "kolo/error.h"

namespace kolo::parallel {
namespace {

using namespace std::chrono_literals;

/// Runs fn(rank) on `size` threads; rethrows the first failure.
void onThreads(int size, const std::function<void(int)>& fn) {
  std::vector<std::thread> threads;
  std::vector<std::exception_ptr> errors(static_cast<size_t>(size));
  for (int r = 0; r < size; ++r)
    threads.emplace_back([&, r] {
      try {
        fn(r);
      } catch (...) {
        errors[static_cast<size_t>(r)] = std::current_exception();
      }
    });
  for (auto& t : threads) t.join();
  for (auto& e : errors)
    if (e) std::rethrow_exception(e);
}

ElasticOptions options(int minRanks) {
  ElasticOptions o;
  o.minRanks = minRanks;
  o.native.timeout = 10s;
  return o;
}

TEST(ElasticContext, SurvivorsFormTheNextGenerationAndALateRankIsRefused) {
  auto store = comm::makeMemoryStore();
  std::vector<std::unique_ptr<ElasticContext>> contexts(3);
  onThreads(3, [&](int r) { contexts[static_cast<size_t>(r)] = std::make_unique<ElasticContext>(store, r, 3, options(1)); });
  for (int r = 0; r < 3; ++r) {
    EXPECT_EQ(contexts[static_cast<size_t>(r)]->generation(), 0);
    EXPECT_EQ(contexts[static_cast<size_t>(r)]->communicator()->size(), 3);
  }
  // Rank 1 is lost (as the launcher marks it); ranks 0 and 2 completed 5 and 4 steps.
  store->setString(elasticLostKey(1), "killed");
  std::vector<MembershipChange> changes(3);
  std::vector<float> sums(3, 0.0f);
  onThreads(3, [&](int r) {
    if (r == 1) return;
    ElasticContext& e = *contexts[static_cast<size_t>(r)];
    changes[static_cast<size_t>(r)] = e.regroup(r == 0 ? 5 : 4, "test");
    float value = static_cast<float>(r + 1);
    e.communicator()->allreduce(&value, &sums[static_cast<size_t>(r)], 1, DType::F32, comm::ReduceOp::Sum);
  });
  for (int r : {0, 2}) {
    const MembershipChange& c = changes[static_cast<size_t>(r)];
    EXPECT_EQ(c.generation, 1);
    EXPECT_EQ(c.members, (std::vector<int>{0, 2}));
    EXPECT_EQ(c.lost, (std::vector<int>{1}));
    EXPECT_EQ(c.step, 4);
    EXPECT_EQ(contexts[static_cast<size_t>(r)]->size(), 2);
    EXPECT_EQ(contexts[static_cast<size_t>(r)]->rank(), r == 0 ? 0 : 1);
    EXPECT_EQ(sums[static_cast<size_t>(r)], 4.0f);  // 1 + 3 over the new communicator
  }
  // Rank 1 comes back, still in generation 0: refused.
  try {
    contexts[1]->regroup(5, "late");
    FAIL() << "a late rank was let in";
  } catch (const PeerError& e) {
    EXPECT_NE(std::string(e.what()).find("generation 1 was formed without it"), std::string::npos) << e.what();
  }
}

// After rank 1 is lost, a joiner (launch rank 3) registers; the survivors agree at a step
// boundary that it waits (joinerWaiting() is true on both), regroup, and the new
// communicator spans the three. Rank 1, coming back with generation 0, is still refused.
TEST(ElasticContext, AJoinerIsAdmittedAtAStepBoundaryAndALateRankIsStillRefused) {
  auto store = comm::makeMemoryStore();
  std::vector<std::unique_ptr<ElasticContext>> contexts(4);
  onThreads(3, [&](int r) { contexts[static_cast<size_t>(r)] = std::make_unique<ElasticContext>(store, r, 3, options(2)); });
  store->setString(elasticLostKey(1), "killed");
  onThreads(3, [&](int r) {
    if (r != 1) contexts[static_cast<size_t>(r)]->regroup(6, "test");  // generation 1: 0 and 2
  });
  std::vector<MembershipChange> changes(4);
  std::vector<int64_t> sums(4, 0);
  onThreads(4, [&](int r) {
    if (r == 1) return;
    if (r == 3) {
      ElasticOptions o = options(2);
      o.maxRanks = 3;
      contexts[3] = ElasticContext::join(store, 3, o);
      ASSERT_NE(contexts[3], nullptr);
      changes[3] = contexts[3]->change();
    } else {
      ElasticContext& e = *contexts[static_cast<size_t>(r)];
      e.awaitJoiners(10s);  // the step boundary, once the joiner has registered
      EXPECT_TRUE(e.joinerWaiting());
      changes[static_cast<size_t>(r)] = e.regroup(6, "joiner waiting");
      EXPECT_FALSE(e.joinerWaiting());  // full: no collective, no joiner
    }
    int64_t value = r + 1;
    contexts[static_cast<size_t>(r)]->communicator()->allreduce(&value, &sums[static_cast<size_t>(r)], 1,
                                                               DType::I64, comm::ReduceOp::Sum);
  });
  for (int r : {0, 2, 3}) {
    const ElasticContext& e = *contexts[static_cast<size_t>(r)];
    EXPECT_EQ(e.generation(), 2);
    EXPECT_EQ(e.members(), (std::vector<int>{0, 2, 3})) << r;
    EXPECT_EQ(e.rank(), r == 0 ? 0 : r == 2 ? 1 : 2);
    EXPECT_EQ(changes[static_cast<size_t>(r)].joined, std::vector<int>{3}) << r;
    EXPECT_EQ(changes[static_cast<size_t>(r)].step, 6) << r;
    EXPECT_EQ(sums[static_cast<size_t>(r)], 1 + 3 + 4);
  }
  try {
    contexts[1]->regroup(5, "late");
    FAIL() << "a late rank was let in";
  } catch (const PeerError& e) {
    EXPECT_NE(std::string(e.what()).find("was formed without it"), std::string::npos) << e.what();
  }
}

// A joiner that registers after the job finished returns null instead of waiting.
TEST(ElasticContext, AJoinerOfAFinishedJobReturnsNull) {
  auto store = comm::makeMemoryStore();
  std::unique_ptr<ElasticContext> only = std::make_unique<ElasticContext>(store, 0, 1, options(1));
  only->finish("done");
  ElasticOptions o = options(1);
  o.maxRanks = 2;
  EXPECT_EQ(ElasticContext::join(store, 1, o), nullptr);
}

TEST(ElasticContext, FewerMembersThanTheMinimumIsAnError) {
  auto store = comm::makeMemoryStore();
  std::vector<std::unique_ptr<ElasticContext>> contexts(2);
  onThreads(2, [&](int r) { contexts[static_cast<size_t>(r)] = std::make_unique<ElasticContext>(store, r, 2, options(2)); });
  store->setString(elasticLostKey(1), "killed");
  try {
    contexts[0]->regroup(3, "peer gone");
    FAIL() << "no error below the minimum";
  } catch (const BelowMinRanksError& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("1 rank(s) left after losing rank(s) 1"), std::string::npos) << what;
    EXPECT_NE(what.find("below ElasticOptions::minRanks 2"), std::string::npos) << what;
    // What was agreed, for the checkpoint the survivor writes before it stops.
    EXPECT_EQ(e.change().members, std::vector<int>{0});
    EXPECT_EQ(e.change().lost, std::vector<int>{1});
    EXPECT_EQ(e.change().step, 3);
  }
}

TEST(ElasticContext, BadArgumentsAreRefused) {
  auto store = comm::makeMemoryStore();
  EXPECT_THROW(ElasticContext(store, 2, 2, options(1)), InvalidArgument);
  EXPECT_THROW(ElasticContext(store, 0, 2, options(3)), InvalidArgument);
}

}  // namespace
}  // namespace kolo::parallel
