// Tests of the MPI backend, run by ctest under `mpirun -np 1..4`: every collective, dtype
// and reduce op against the closed-form values of comm/closed_form.h, in place and out of
// place, split, point to point, signature checks and timeouts.
#include <gtest/gtest.h>

#include <cstring>
#include <memory>
#include <numeric>
#include <set>
#include <vector>

#include "comm/closed_form.h"
#include "kolo/comm/mpi.h"
#include "kolo/error.h"
#include "mpi_test_support.h"

namespace kolo::comm {
namespace {

using test::Buffer;
using test::world;

using detail::closedFormCode;
using detail::closedFormInput;
using detail::closedFormResult;
using detail::kAllDTypes;
using detail::kAllReduceOps;

class MpiReduceTest : public ::testing::TestWithParam<std::tuple<DType, ReduceOp>> {};

TEST_P(MpiReduceTest, AllreduceOutOfPlaceAndInPlace) {
  const auto [dtype, op] = GetParam();
  auto comm = world();
  const int n = comm->size();
  for (size_t count : {size_t{0}, size_t{1}, size_t{7}, size_t{1031}}) {
    Buffer in(dtype, count), out(dtype, count), inplace(dtype, count);
    for (size_t i = 0; i < count; ++i) {
      in.set(i, closedFormInput(op, comm->rank(), comm->size(), i));
      inplace.set(i, closedFormInput(op, comm->rank(), comm->size(), i));
    }
    comm->allreduce(in.data(), out.data(), count, dtype, op);
    comm->allreduce(inplace.data(), inplace.data(), count, dtype, op);
    for (size_t i = 0; i < count; ++i) {
      ASSERT_EQ(out.get(i), closedFormResult(op, n, i, dtype)) << "out of place, count " << count << " element " << i;
      ASSERT_EQ(inplace.get(i), closedFormResult(op, n, i, dtype)) << "in place, count " << count << " element " << i;
      ASSERT_EQ(in.get(i), closedFormInput(op, comm->rank(), comm->size(), i)) << "input changed at " << i;
    }
  }
}

TEST_P(MpiReduceTest, ReduceToLastRank) {
  const auto [dtype, op] = GetParam();
  auto comm = world();
  const int n = comm->size();
  const int root = n - 1;
  const size_t count = 7;
  Buffer buf(dtype, count), out(dtype, count);
  for (size_t i = 0; i < count; ++i) buf.set(i, closedFormInput(op, comm->rank(), comm->size(), i));
  comm->reduce(buf.data(), out.data(), count, dtype, op, root);
  comm->reduce(buf.data(), buf.data(), count, dtype, op, root);
  if (comm->rank() == root) {
    for (size_t i = 0; i < count; ++i) {
      ASSERT_EQ(out.get(i), closedFormResult(op, n, i, dtype)) << "element " << i;
      ASSERT_EQ(buf.get(i), closedFormResult(op, n, i, dtype)) << "in place, element " << i;
    }
  }
}

TEST_P(MpiReduceTest, ReduceScatterBlocks) {
  const auto [dtype, op] = GetParam();
  auto comm = world();
  const int n = comm->size();
  const size_t recvcount = 5;
  // Block b, element j of every rank's input is closedFormInput(op, r, n, b * recvcount + j),
  // so rank b's result is closedFormResult(op, n, b * recvcount + j, dtype).
  Buffer in(dtype, recvcount * n), out(dtype, recvcount), inplace(dtype, recvcount * n);
  for (size_t i = 0; i < recvcount * n; ++i) {
    in.set(i, closedFormInput(op, comm->rank(), comm->size(), i));
    inplace.set(i, closedFormInput(op, comm->rank(), comm->size(), i));
  }
  comm->reduceScatter(in.data(), out.data(), recvcount, dtype, op);
  comm->reduceScatter(inplace.data(), inplace.data(), recvcount, dtype, op);
  for (size_t j = 0; j < recvcount; ++j) {
    const size_t global = comm->rank() * recvcount + j;
    ASSERT_EQ(out.get(j), closedFormResult(op, n, global, dtype)) << "element " << j;
    ASSERT_EQ(inplace.get(j), closedFormResult(op, n, global, dtype)) << "in place, element " << j;
  }
}

TEST_P(MpiReduceTest, NonBlockingAllreduce) {
  const auto [dtype, op] = GetParam();
  auto comm = world();
  const size_t count = 33;
  // Two operations in flight at once: out of place from `a` into `b`, in place on `c`.
  Buffer a(dtype, count), b(dtype, count), c(dtype, count);
  for (size_t i = 0; i < count; ++i) {
    a.set(i, closedFormInput(op, comm->rank(), comm->size(), i));
    c.set(i, closedFormInput(op, comm->rank(), comm->size(), i));
  }
  auto first = comm->iallreduce(a.data(), b.data(), count, dtype, op);
  auto second = comm->iallreduce(c.data(), c.data(), count, dtype, op);
  first->wait();
  second->wait();
  EXPECT_TRUE(first->test());
  for (size_t i = 0; i < count; ++i) {
    ASSERT_EQ(b.get(i), closedFormResult(op, comm->size(), i, dtype)) << "element " << i;
    ASSERT_EQ(c.get(i), closedFormResult(op, comm->size(), i, dtype)) << "in place, element " << i;
  }
}

INSTANTIATE_TEST_SUITE_P(AllDTypesAndOps, MpiReduceTest,
                         ::testing::Combine(::testing::ValuesIn(kAllDTypes), ::testing::ValuesIn(kAllReduceOps)),
                         [](const auto& info) {
                           return std::string(dtypeName(std::get<0>(info.param))) + "_" +
                                  std::string(reduceOpName(std::get<1>(info.param)));
                         });

TEST(MpiCommunicator, AllreducePrimeCountAboveOneMillion) {
  auto comm = world();
  const size_t count = 1000003;
  for (DType dtype : {DType::F32, DType::F64, DType::BF16, DType::I64}) {
    Buffer buf(dtype, count);
    for (size_t i = 0; i < count; ++i) buf.set(i, closedFormInput(ReduceOp::Sum, comm->rank(), comm->size(), i));
    comm->allreduce(buf.data(), buf.data(), count, dtype, ReduceOp::Sum);
    for (size_t i = 0; i < count; ++i) {
      ASSERT_EQ(buf.get(i), closedFormResult(ReduceOp::Sum, comm->size(), i, dtype))
          << dtypeName(dtype) << " element " << i;
    }
  }
}

class MpiMoveTest : public ::testing::TestWithParam<DType> {};

TEST_P(MpiMoveTest, BroadcastFromEveryRoot) {
  const DType dtype = GetParam();
  auto comm = world();
  for (int root = 0; root < comm->size(); ++root) {
    for (size_t count : {size_t{0}, size_t{1}, size_t{7}, size_t{4099}}) {
      Buffer buf(dtype, count);
      for (size_t i = 0; i < count; ++i) buf.set(i, comm->rank() == root ? closedFormCode(root, 0, i) : 0);
      comm->broadcast(buf.data(), count, dtype, root);
      for (size_t i = 0; i < count; ++i)
        ASSERT_EQ(buf.get(i), closedFormCode(root, 0, i)) << "root " << root << " i " << i;
      buf.fill(comm->rank() == root ? 5 : 0);
      comm->ibroadcast(buf.data(), count, dtype, root)->wait();
      for (size_t i = 0; i < count; ++i) ASSERT_EQ(buf.get(i), 5) << "ibroadcast root " << root;
    }
  }
}

TEST_P(MpiMoveTest, AllgatherOutOfPlaceAndInPlace) {
  const DType dtype = GetParam();
  auto comm = world();
  const int n = comm->size();
  for (size_t count : {size_t{0}, size_t{1}, size_t{7}}) {
    Buffer mine(dtype, count), all(dtype, count * n), inplace(dtype, count * n);
    for (size_t i = 0; i < count; ++i) {
      mine.set(i, closedFormCode(comm->rank(), 0, i));
      inplace.set(comm->rank() * count + i, closedFormCode(comm->rank(), 0, i));
    }
    comm->allgather(mine.data(), all.data(), count, dtype);
    comm->allgather(inplace.at(comm->rank() * count), inplace.data(), count, dtype);
    for (int r = 0; r < n; ++r) {
      for (size_t i = 0; i < count; ++i) {
        ASSERT_EQ(all.get(r * count + i), closedFormCode(r, 0, i)) << "block " << r << " element " << i;
        ASSERT_EQ(inplace.get(r * count + i), closedFormCode(r, 0, i)) << "in place, block " << r << " element " << i;
      }
    }
  }
}

TEST_P(MpiMoveTest, AllgathervRankSizedBlocks) {
  const DType dtype = GetParam();
  auto comm = world();
  const int n = comm->size();
  std::vector<size_t> counts(n);
  for (int r = 0; r < n; ++r) counts[r] = static_cast<size_t>(r % 3);  // includes empty blocks
  const size_t total = std::accumulate(counts.begin(), counts.end(), size_t{0});
  Buffer mine(dtype, counts[comm->rank()]), all(dtype, total);
  for (size_t i = 0; i < counts[comm->rank()]; ++i) mine.set(i, closedFormCode(comm->rank(), 1, i));
  comm->allgatherv(mine.data(), all.data(), counts, dtype);
  size_t offset = 0;
  for (int r = 0; r < n; ++r) {
    for (size_t i = 0; i < counts[r]; ++i) ASSERT_EQ(all.get(offset + i), closedFormCode(r, 1, i)) << "rank " << r;
    offset += counts[r];
  }
}

TEST_P(MpiMoveTest, GatherAndScatterAtEveryRoot) {
  const DType dtype = GetParam();
  auto comm = world();
  const int n = comm->size();
  const size_t count = 7;
  for (int root = 0; root < n; ++root) {
    Buffer mine(dtype, count), all(dtype, count * n);
    for (size_t i = 0; i < count; ++i) mine.set(i, closedFormCode(comm->rank(), root, i));
    comm->gather(mine.data(), all.data(), count, dtype, root);
    if (comm->rank() == root) {
      for (int r = 0; r < n; ++r) {
        for (size_t i = 0; i < count; ++i) ASSERT_EQ(all.get(r * count + i), closedFormCode(r, root, i)) << "gather";
      }
    }
    // Scatter: the root's block d goes to rank d.
    Buffer source(dtype, count * n), part(dtype, count);
    for (int d = 0; d < n; ++d) {
      for (size_t i = 0; i < count; ++i) source.set(d * count + i, closedFormCode(root, d, i));
    }
    comm->scatter(source.data(), part.data(), count, dtype, root);
    for (size_t i = 0; i < count; ++i) ASSERT_EQ(part.get(i), closedFormCode(root, comm->rank(), i)) << "scatter";
    comm->scatter(source.data(), source.at(root * count), count, dtype, root);  // in place at the root
    if (comm->rank() == root) {
      for (size_t i = 0; i < count; ++i) ASSERT_EQ(source.get(root * count + i), closedFormCode(root, root, i));
    }
  }
}

TEST_P(MpiMoveTest, AlltoallOutOfPlaceAndInPlace) {
  const DType dtype = GetParam();
  auto comm = world();
  const int n = comm->size();
  const size_t count = 3;
  Buffer send(dtype, count * n), recv(dtype, count * n);
  for (int d = 0; d < n; ++d) {
    for (size_t i = 0; i < count; ++i) send.set(d * count + i, closedFormCode(comm->rank(), d, i));
  }
  Buffer inplace = send;
  comm->alltoall(send.data(), recv.data(), count, dtype);
  comm->alltoall(inplace.data(), inplace.data(), count, dtype);
  for (int s = 0; s < n; ++s) {
    for (size_t i = 0; i < count; ++i) {
      ASSERT_EQ(recv.get(s * count + i), closedFormCode(s, comm->rank(), i)) << "from " << s;
      ASSERT_EQ(inplace.get(s * count + i), closedFormCode(s, comm->rank(), i)) << "in place, from " << s;
    }
  }
}

INSTANTIATE_TEST_SUITE_P(AllDTypes, MpiMoveTest, ::testing::ValuesIn(kAllDTypes),
                         [](const auto& info) { return std::string(dtypeName(info.param)); });

TEST(MpiCommunicator, ReportsBackendAndWorld) {
  auto comm = world();
  EXPECT_TRUE(mpiAvailable());
  EXPECT_EQ(comm->backendName(), "mpi");
  EXPECT_EQ(comm->size(), test::mpiWorldSizeFromEnvironment());
  comm->barrier();
}

TEST(MpiCommunicator, SplitEvenOddInReverseOrder) {
  auto comm = world();
  const int n = comm->size();
  const int color = comm->rank() % 2;
  auto sub = comm->split(color, -comm->rank());  // key reverses the order
  ASSERT_NE(sub, nullptr);
  std::vector<int> members;
  for (int r = n - 1; r >= 0; --r) {
    if (r % 2 == color) members.push_back(r);
  }
  ASSERT_EQ(sub->size(), static_cast<int>(members.size()));
  EXPECT_EQ(members[sub->rank()], comm->rank());
  int64_t value = comm->rank();
  sub->allreduce(&value, &value, 1, DType::I64, ReduceOp::Sum);
  EXPECT_EQ(value, std::accumulate(members.begin(), members.end(), int64_t{0}));
  // A negative color leaves rank 0 out.
  auto rest = comm->split(comm->rank() == 0 ? -1 : 0, 0);
  if (comm->rank() == 0) {
    EXPECT_EQ(rest, nullptr);
  } else {
    ASSERT_NE(rest, nullptr);
    EXPECT_EQ(rest->size(), n - 1);
    EXPECT_EQ(rest->rank(), comm->rank() - 1);
  }
}

TEST(MpiCommunicator, PointToPointRing) {
  auto comm = world();
  const int n = comm->size();
  const int right = (comm->rank() + 1) % n;
  const int left = (comm->rank() + n - 1) % n;
  std::vector<float> out(1000, static_cast<float>(comm->rank())), in(1000, -1.f);
  auto receive = comm->irecv(in.data(), in.size(), DType::F32, left, 3);
  auto sendWork = comm->isend(out.data(), out.size(), DType::F32, right, 3);
  receive->wait();
  sendWork->wait();
  for (float v : in) ASSERT_EQ(v, static_cast<float>(left));
  if (n >= 2) {  // blocking forms, even ranks send first
    int64_t token = comm->rank() * 10, got = -1;
    if (comm->rank() % 2 == 0) {
      comm->send(&token, 1, DType::I64, right, 4);
      comm->recv(&got, 1, DType::I64, left, 4);
    } else {
      comm->recv(&got, 1, DType::I64, left, 4);
      comm->send(&token, 1, DType::I64, right, 4);
    }
    EXPECT_EQ(got, left * 10);
  }
}

// kAnySource receives MPI_ANY_SOURCE's message and Work::source() names its sender.
TEST(MpiCommunicator, ReceiveFromAnySourceNamesTheSender) {
  auto comm = world();
  if (comm->size() < 2) GTEST_SKIP() << "needs 2 ranks";
  if (comm->rank() == 0) {
    std::set<int> senders;
    for (int i = 1; i < comm->size(); ++i) {
      int64_t got = -1;
      auto receive = comm->irecv(&got, 1, DType::I64, kAnySource, 6);
      receive->wait();
      EXPECT_EQ(got, receive->source() * 100);
      senders.insert(receive->source());
    }
    EXPECT_EQ(static_cast<int>(senders.size()), comm->size() - 1);
  } else {
    const int64_t mine = comm->rank() * 100;
    comm->send(&mine, 1, DType::I64, 0, 6);
  }
  comm->barrier();
}

TEST(MpiCommunicator, ReceivedLengthMismatchIsMismatch) {
  auto comm = world();
  if (comm->size() < 2) GTEST_SKIP() << "needs 2 ranks";
  int32_t data[5] = {1, 2, 3, 4, 5};
  if (comm->rank() == 0) {
    comm->send(data, 3, DType::I32, 1, 7);  // shorter than expected
    comm->send(data, 5, DType::I32, 1, 8);  // longer than expected
  } else if (comm->rank() == 1) {
    EXPECT_THROW(comm->recv(data, 5, DType::I32, 0, 7), Mismatch);
    EXPECT_THROW(comm->recv(data, 2, DType::I32, 0, 8), Mismatch);
  }
  comm->barrier();
}

TEST(MpiCommunicator, InvalidArgumentsAreRejectedOnEveryRank) {
  auto comm = world();
  float x = 0;
  EXPECT_THROW(comm->broadcast(&x, 1, DType::F32, comm->size()), InvalidArgument);
  EXPECT_THROW(comm->send(&x, 1, DType::F32, -1), InvalidArgument);
  std::vector<size_t> wrongCounts(comm->size() + 1, 1);
  EXPECT_THROW(comm->allgatherv(&x, &x, wrongCounts, DType::F32), InvalidArgument);
  comm->barrier();
}

TEST(MpiCommunicator, SignatureCheckNamesBothSides) {
  auto base = world();
  if (base->size() < 2) GTEST_SKIP() << "needs 2 ranks";
  MpiOptions options;
  options.checkSignatures = true;
  options.timeout = std::chrono::seconds(30);
  auto comm = createMpiCommunicator(options);
  std::vector<float> buf(8, 1.f);
  comm->allreduce(buf.data(), buf.data(), 8, DType::F32, ReduceOp::Sum);  // agreeing ranks pass
  EXPECT_EQ(buf[0], static_cast<float>(comm->size()));
  const size_t count = comm->rank() == 1 ? 5 : 4;
  try {
    comm->allreduce(buf.data(), buf.data(), count, DType::F32, ReduceOp::Sum);
    ADD_FAILURE() << "no Mismatch for differing counts";
  } catch (const Mismatch& e) {
    const std::string text = e.what();
    EXPECT_NE(text.find("count=5"), std::string::npos) << text;
    EXPECT_NE(text.find("count=4"), std::string::npos) << text;
    EXPECT_NE(text.find("rank 1"), std::string::npos) << text;
  }
  // Different operations are caught as well.
  if (comm->rank() == 0) {
    EXPECT_THROW(comm->broadcast(buf.data(), 4, DType::F32, 0), Mismatch);
  } else {
    EXPECT_THROW(comm->allreduce(buf.data(), buf.data(), 4, DType::F32, ReduceOp::Max), Mismatch);
  }
  base->barrier();
}

TEST(MpiCommunicator, CollectiveTimeoutNamesTheOperation) {
  auto base = world();
  if (base->size() < 2) GTEST_SKIP() << "needs 2 ranks";
  MpiOptions options;
  options.timeout = std::chrono::seconds(30);
  auto comm = createMpiCommunicator(options);
  if (comm->rank() == 0) {
    CollectiveOptions quick;
    quick.timeout = std::chrono::milliseconds(200);
    try {
      comm->barrier(quick);
      ADD_FAILURE() << "barrier without peers did not time out";
    } catch (const Timeout& e) {
      EXPECT_NE(std::string(e.what()).find("barrier"), std::string::npos) << e.what();
    }
    float x = 0;
    EXPECT_THROW(comm->allreduce(&x, &x, 1, DType::F32, ReduceOp::Sum), Error);  // unusable now
  }
  base->barrier();
  if (comm->rank() != 0) comm->barrier();  // lets rank 0's abandoned barrier complete
}

TEST(MpiCommunicator, SharedWindowShowsEveryRanksPart) {
  // mpirun starts every rank on this node, so the window exists.
  auto comm = world();
  constexpr size_t kFloats = 4099;
  auto window = comm->allocateSharedWindow(kFloats * sizeof(float));
  ASSERT_NE(window, nullptr);
  auto* mine = static_cast<float*>(window->local());
  for (size_t i = 0; i < kFloats; ++i) ASSERT_EQ(mine[i], 0.0f) << i;
  for (size_t i = 0; i < kFloats; ++i) mine[i] = static_cast<float>(comm->rank() * 10000 + i);
  comm->barrier();
  for (int r = 0; r < comm->size(); ++r) {
    const auto* part = static_cast<const float*>(window->part(r));
    for (size_t i = 0; i < kFloats; i += 97)
      ASSERT_EQ(part[i], static_cast<float>(r * 10000 + i)) << "rank " << r << " element " << i;
  }
  comm->barrier();
}

TEST(MpiCommunicator, PointToPointTimeoutThenLateMessage) {
  auto comm = world();
  if (comm->size() < 2) GTEST_SKIP() << "needs 2 ranks";
  int32_t value = -1;
  if (comm->rank() == 0) {
    auto work = comm->irecv(&value, 1, DType::I32, 1, 99);
    EXPECT_THROW(work->wait(std::chrono::milliseconds(100)), Timeout);
    comm->barrier();  // now rank 1 sends
    work->wait();
    EXPECT_EQ(value, 42);
  } else {
    comm->barrier();
    if (comm->rank() == 1) {
      value = 42;
      comm->send(&value, 1, DType::I32, 0, 99);
    }
  }
  comm->barrier();
}

}  // namespace
}  // namespace kolo::comm
