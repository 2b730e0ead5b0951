// The Tensor forms of every Communicator operation (kolo/parallel/collectives.h) over the
// native communicator with ranks as threads, world sizes 1 to 4: each rank contributes
// values made from its rank, and the results are checked in closed form; bad tensors are
// refused before any message is sent.
#include "kolo/parallel/collectives.h"

#include <gtest/gtest.h>

#include "kolo/error.h"
#include "native_ranks.h"
#include "support/error_text.h"
#include "toy_setup.h"

namespace kolo::parallel {
namespace {
using namespace testing;

// Rank r's tensor of `shape`: element i holds base + 100 * r + i.
Tensor ranked(const Shape& shape, int r, double base = 0.0, DType dtype = DType::F32) {
  std::vector<double> v(static_cast<size_t>(shapeNumel(shape)));
  for (size_t i = 0; i < v.size(); ++i) v[i] = base + 100.0 * r + static_cast<double>(i);
  return Tensor::fromVector(shape, v).to(dtype);
}

class TensorCollectives : public ::testing::TestWithParam<int> {
 protected:
  // Runs fn(rank, communicator) on GetParam() ranks.
  void onRanks(const std::function<void(int, comm::Communicator&)>& fn) {
    const int n = GetParam();
    auto connect = nativeRanks(n);
    runThreads(n, [&](int r) {
      auto comm = connect(r);
      fn(r, *comm);
    });
  }
};

TEST_P(TensorCollectives, AllReduceBroadcastAndReduce) {
  const int n = GetParam();
  onRanks([&](int r, comm::Communicator& comm) {
    Tensor t = ranked({2, 3}, r, 0.0, DType::F64);
    allReduce(comm, t);
    // sum over ranks of 100 r + i = 100 n(n-1)/2 + n i
    for (int i = 0; i < 6; ++i) EXPECT_EQ(t.toDoubleVector()[i], 50.0 * n * (n - 1) + n * i);
    Tensor m = ranked({5}, r);
    iallReduce(comm, m, comm::ReduceOp::Max)->wait();
    EXPECT_EQ(m.toFloatVector(), ranked({5}, n - 1).toFloatVector());

    Tensor b = ranked({3, 2}, r, 7.0, DType::I64);
    broadcast(comm, b, n - 1);
    EXPECT_EQ(b.toDoubleVector(), ranked({3, 2}, n - 1, 7.0, DType::I64).toDoubleVector());
    Tensor ib = ranked({4}, r);
    ibroadcast(comm, ib, 0)->wait();
    EXPECT_EQ(ib.toFloatVector(), ranked({4}, 0).toFloatVector());

    Tensor s = ranked({4}, r);
    reduce(comm, s, 0);
    if (r == 0) {
      for (int i = 0; i < 4; ++i) EXPECT_EQ(s.toFloatVector()[i], 50.0f * n * (n - 1) + n * i);
    } else {
      EXPECT_EQ(s.toFloatVector(), ranked({4}, r).toFloatVector());  // left as it was
    }
  });
}

TEST_P(TensorCollectives, GatherFamily) {
  const int n = GetParam();
  onRanks([&](int r, comm::Communicator& comm) {
    // allGather: [2, 3] per rank -> [2n, 3], rank order.
    Tensor out = Tensor::empty({2 * n, 3});
    allGather(comm, ranked({2, 3}, r), out);
    for (int k = 0; k < n; ++k)
      EXPECT_EQ(out.slice(0, 2 * k, 2 * k + 2).toFloatVector(), ranked({2, 3}, k).toFloatVector());
    Tensor scalars = Tensor::empty({n}, DType::I64);
    allGather(comm, Tensor::scalar(r, DType::I64), scalars);
    for (int k = 0; k < n; ++k) EXPECT_EQ(scalars.toDoubleVector()[k], k);

    // Uneven: rank r gives r + 1 rows of 2.
    Tensor uneven = allGatherUneven(comm, ranked({r + 1, 2}, r));
    ASSERT_EQ(uneven.shape(), (Shape{n * (n + 1) / 2, 2}));
    int64_t row = 0;
    for (int k = 0; k < n; ++k) {
      EXPECT_EQ(uneven.slice(0, row, row + k + 1).toFloatVector(), ranked({k + 1, 2}, k).toFloatVector());
      row += k + 1;
    }

    // gather to the last rank; other ranks pass no output.
    const int root = n - 1;
    Tensor gathered = r == root ? Tensor::empty({n, 4}) : Tensor();
    gather(comm, ranked({1, 4}, r), gathered, root);
    if (r == root) {
      for (int k = 0; k < n; ++k)
        EXPECT_EQ(gathered.slice(0, k, k + 1).toFloatVector(), ranked({1, 4}, k).toFloatVector());
    }
  });
}

TEST_P(TensorCollectives, ScatterReduceScatterAndAllToAll) {
  const int n = GetParam();
  onRanks([&](int r, comm::Communicator& comm) {
    // scatter from rank 0: [n * 2, 3] -> [2, 3], block r.
    Tensor whole = r == 0 ? ranked({n * 2, 3}, 0) : Tensor();
    Tensor part = Tensor::empty({2, 3});
    scatter(comm, whole, part, 0);
    EXPECT_EQ(part.toFloatVector(), ranked({n * 2, 3}, 0).slice(0, 2 * r, 2 * r + 2).toFloatVector());

    // reduceScatter: input [n * 3] of 100 r + i; block r of the sum is
    // 100 n(n-1)/2 + n (3 r + j).
    Tensor reduced = Tensor::empty({3}, DType::F64);
    reduceScatter(comm, ranked({n * 3}, r, 0.0, DType::F64), reduced);
    for (int j = 0; j < 3; ++j)
      EXPECT_EQ(reduced.toDoubleVector()[j], 50.0 * n * (n - 1) + n * (3.0 * r + j));

    // allToAll: block j of rank i's input (values 100 i + 2 j + c) lands in block i of
    // rank j's output.
    Tensor exchanged = Tensor::empty({n * 2});
    allToAll(comm, ranked({n * 2}, r), exchanged);
    for (int i = 0; i < n; ++i)
      for (int c = 0; c < 2; ++c)
        EXPECT_EQ(exchanged.toFloatVector()[2 * i + c], 100.0f * i + 2 * r + c);
  });
}

TEST_P(TensorCollectives, SendAndRecvAroundARing) {
  const int n = GetParam();
  if (n == 1) GTEST_SKIP() << "no peer";
  onRanks([&](int r, comm::Communicator& comm) {
    const int right = (r + 1) % n, left = (r + n - 1) % n;
    Tensor got = Tensor::empty({2, 2}, DType::F64);
    auto pending = irecv(comm, got, left, 3);
    send(comm, ranked({2, 2}, r, 0.0, DType::F64), right, 3);
    pending->wait();
    EXPECT_EQ(got.toDoubleVector(), ranked({2, 2}, left, 0.0, DType::F64).toDoubleVector());

    Tensor back = Tensor::empty({3}, DType::I32);
    auto sent = isend(comm, ranked({3}, r, 1.0, DType::I32), left, 4);
    recv(comm, back, right, 4);
    sent->wait();
    EXPECT_EQ(back.toDoubleVector(), ranked({3}, right, 1.0, DType::I32).toDoubleVector());
  });
}

INSTANTIATE_TEST_SUITE_P(Ranks, TensorCollectives, ::testing::Values(1, 2, 3, 4));

std::string errorOf(const std::function<void()>& fn) {
  return kolo::testing::errorOf<InvalidArgument>(fn);
}

// Every rank passes the same bad tensors, so each throws before any message.
TEST(TensorCollectivesChecks, BadTensorsAreRefusedWithWhatWasExpected) {
  const int n = 2;
  auto connect = nativeRanks(n);
  runThreads(n, [&](int r) {
    auto comm = connect(r);
    Tensor wide = Tensor::zeros({3, 4});
    Tensor strided = wide.transpose(0, 1);
    strided.setName("weights");
    std::string what = errorOf([&] { allReduce(*comm, strided); });
    EXPECT_NE(what.find("allReduce: tensor 'weights' [4, 3] f32 is not contiguous"), std::string::npos) << what;
    Tensor undefined;
    what = errorOf([&] { broadcast(*comm, undefined, 0); });
    EXPECT_NE(what.find("broadcast: tensor is undefined"), std::string::npos) << what;

    Tensor out = Tensor::empty({5, 4});
    what = errorOf([&] { allGather(*comm, wide, out); });
    EXPECT_NE(what.find("allGather: output is [5, 4] f32, expected [6, 4]"), std::string::npos) << what;
    Tensor outF64 = Tensor::empty({6, 4}, DType::F64);
    what = errorOf([&] { allGather(*comm, wide, outF64); });
    EXPECT_NE(what.find("differ in dtype"), std::string::npos) << what;

    Tensor part = Tensor::empty({1, 4});
    what = errorOf([&] { reduceScatter(*comm, wide, part); });
    EXPECT_NE(what.find("reduceScatter: input [3, 4] f32 does not split into 2 blocks"), std::string::npos)
        << what;
    Tensor same = Tensor::empty({4, 3});
    what = errorOf([&] { allToAll(*comm, Tensor::zeros({4, 4}), same); });
    EXPECT_NE(what.find("allToAll: output is [4, 3] f32, expected [4, 4]"), std::string::npos) << what;
    Tensor gathered = Tensor::empty({6, 4});
    if (r == 0) {
      what = errorOf([&] { gather(*comm, Tensor::zeros({2, 4}), gathered, 0); });
      EXPECT_NE(what.find("gather: output is [6, 4] f32, expected [4, 4]"), std::string::npos) << what;
    }
    // The communicator still works: nothing was half sent.
    Tensor t = Tensor::full({2}, r + 1.0);
    allReduce(*comm, t);
    EXPECT_EQ(t.toFloatVector(), (std::vector<float>{3.0f, 3.0f}));
  });
}

}  // namespace
}  // namespace kolo::parallel
