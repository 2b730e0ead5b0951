// The shared-memory path between a client and a parameter server on one host: a client whose
// offer the server can map exchanges its values through the segment (its pushes and the
// replies carry no payload); an offer from another host, or of a segment that is not the
// one offered (another cookie), leaves the connection on TCP; a client told not to share, or
// one that compresses, stays on TCP too. In sync mode a worker computes on the server's own
// values (shared memory, mapped read-only) and pushes the gradients it computed in its segment.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstring>

#include "parallel/ps/shared_exchange.h"
#include "parallel/ps/wire.h"
#include "ps_harness.h"

namespace kolo::parallel::ps::testing {
namespace {

std::unique_ptr<optim::Optimizer> sgd(const NamedTensors& params) {
  return std::make_unique<optim::Sgd>(params, optim::SgdOptions{.lr = 0.1});
}

detail::Clock::time_point soon() { return detail::deadlineAfter(std::chrono::seconds(30)); }

/// A raw connection of the chief to `address`, past its hello; `*elements` receives the
/// server's element count.
detail::Socket chiefConnection(const std::string& address, int64_t* elements) {
  detail::Socket socket = detail::connectTo(address, soon(), "parameter server 0");
  const detail::Header answer =
      detail::hello(socket, 0, static_cast<int64_t>(ClientRole::Chief), kToken, soon());
  *elements = answer.b;
  return socket;
}

/// Offers `segment` (its descriptor, with `cookie` and `hostId`) and returns the reply's `a`:
/// 1 when the server mapped it; `*values` receives where the server's values are, if it
/// offers them.
int64_t offer(detail::Socket& socket, const detail::SharedExchange& segment, uint64_t cookie,
              const std::string& hostId, detail::ValuesOffer* values = nullptr) {
  std::string payload(sizeof cookie, '\0');
  std::memcpy(payload.data(), &cookie, sizeof cookie);
  payload += hostId;
  const detail::Header h =
      detail::request(detail::Op::Share, ::getpid(), segment.fd(), payload.size());
  iovec parts[2] = {{const_cast<detail::Header*>(&h), sizeof h}, {payload.data(), payload.size()}};
  socket.sendAll(parts, 2, soon(), "the offer");
  const detail::Header answer = detail::recvHeader(socket, soon(), "the reply to the offer");
  EXPECT_EQ(answer.op, static_cast<uint32_t>(detail::Status::Ok));
  // A (sync) server's values come with a mapped segment only.
  EXPECT_TRUE(answer.payload == 0 ||
              (answer.a == 1 && answer.payload == sizeof(detail::ValuesOffer)));
  detail::ValuesOffer offered;
  if (answer.payload != 0) socket.recvAll(&offered, sizeof offered, soon(), "the values offer");
  if (values != nullptr) *values = offered;
  return answer.a;
}

TEST(SharedMemory, AnOfferFromAnotherHostOrOfAnotherSegmentLeavesTheConnectionOnTcp) {
  const Placement placement = placeParameters(makeMlp()->namedParameters(), 1, 1 << 20);
  ServerThreads job(1, 1, Mode::Async, 0, placement, sgd);
  const std::string here = comm::detail::machineHostId();
  int64_t elements = 0;

  detail::Socket elsewhere = chiefConnection(job.addresses()[0], &elements);
  ASSERT_EQ(elements, placement.elementsOf(0));
  const auto segment = detail::SharedExchange::create(elements, "shared-memory-test");
  EXPECT_EQ(offer(elsewhere, segment, segment.cookie(), "another-host/boot/1"), 0);

  detail::Socket foreign = chiefConnection(job.addresses()[0], &elements);
  EXPECT_EQ(offer(foreign, segment, segment.cookie() + 1, here), 0);

  detail::Socket shared = chiefConnection(job.addresses()[0], &elements);
  EXPECT_EQ(offer(shared, segment, segment.cookie(), here), 1);
  // A pull is now answered by a header alone, the values in the segment.
  const detail::Header pull = detail::request(detail::Op::Pull);
  shared.sendAll(&pull, sizeof pull, soon(), "a pull");
  const detail::Header answer = detail::recvHeader(shared, soon(), "the values");
  EXPECT_EQ(answer.op, static_cast<uint32_t>(detail::Status::Ok));
  EXPECT_EQ(answer.payload, 0u);
  const std::vector<float> held = job.server(0).values();
  EXPECT_EQ(std::vector<float>(segment.values(), segment.values() + elements), held);

  // The connections that stayed on TCP still get their values over the socket.
  foreign.sendAll(&pull, sizeof pull, soon(), "a pull");
  EXPECT_EQ(detail::recvHeader(foreign, soon(), "the values").payload,
            static_cast<uint64_t>(elements) * 4);
  // The chief's connections are not counted among the workers'.
  EXPECT_EQ(job.server(0).stats().sharedWorkers, 0);
}

TEST(SharedMemory, AWorkerSharesUnlessToldNotToOrCompressing) {
  const Placement placement = placeParameters(makeMlp()->namedParameters(), 2, 1 << 20);
  ServerThreads job(2, 3, Mode::Async, 0, placement, sgd);
  auto model = makeMlp();
  const NamedTensors params = model->namedParameters();
  const auto options = [](int index, Compression compression, bool sharedMemory) {
    return ClientOptions{ClientRole::Worker,       index,       compression, kToken,
                         std::chrono::seconds(30), sharedMemory};
  };
  ServerGroup shared(options(0, Compression::None, true), placement, job.addresses());
  ServerGroup tcp(options(1, Compression::None, false), placement, job.addresses());
  ServerGroup packed(options(2, Compression::Bf16, true), placement, job.addresses());
  EXPECT_EQ(shared.sharedServers(), 2);
  EXPECT_EQ(tcp.sharedServers(), 0);
  EXPECT_EQ(packed.sharedServers(), 0);
  EXPECT_EQ(job.server(0).stats().sharedWorkers, 1);
  EXPECT_EQ(job.server(1).stats().sharedWorkers, 1);

  // A push of ones through the segment is one SGD step of lr 0.1 on every value, and the
  // reply brings them back.
  int64_t version = shared.pull(params);
  const std::vector<double> before = parallel::testing::flatValues(params);
  for (auto& [name, p] : params) {
    Tensor handle = p;
    handle.setGrad(Tensor::ones(p.shape()));
  }
  version = shared.pushPull(params, version);
  EXPECT_EQ(version, 1);
  const std::vector<double> after = parallel::testing::flatValues(params);
  ASSERT_EQ(after.size(), before.size());
  for (size_t i = 0; i < after.size(); i += 997)
    EXPECT_NEAR(after[i], before[i] - 0.1, 1e-6) << "value " << i;
  auto viaTcp = makeMlp();
  tcp.pull(viaTcp->namedParameters());
  EXPECT_EQ(parallel::testing::flatValues(viaTcp->namedParameters()), after);
}

TEST(SharedMemory, SyncRepliesAreReadFromTheServersOwnValuesAndGradientsPushedInPlace) {
  // 1 MiB: the first layer's weight is split over the two servers, so its gradient is copied
  // into both segments while the other parameters' gradients are computed in theirs.
  const Placement placement = placeParameters(makeMlp()->namedParameters(), 2, 1 << 20);
  ServerThreads job(2, 1, Mode::Sync, 0, placement, sgd);
  auto model = makeMlp();
  const NamedTensors params = model->namedParameters();
  ServerGroup group({ClientRole::Worker, 0, Compression::None, kToken, std::chrono::seconds(30)},
                    placement, job.addresses());
  EXPECT_EQ(group.sharedValueServers(), 2);
  for (auto& [name, p] : params) {
    Tensor handle = p;
    handle.setGrad(Tensor::full(p.shape(), 2.0));
  }
  EXPECT_EQ(group.placeGradients(params), static_cast<int>(params.size()) - 1);
  // The whole parameters compute on the servers' values themselves; the split one is copied.
  EXPECT_EQ(group.placeValues(params), static_cast<int>(params.size()) - 1);
  int64_t version = group.pull(params);
  const std::vector<double> before = parallel::testing::flatValues(params);
  // The gradients placed in the segments kept their values: one step of 2 x lr 0.1.
  version = group.pushPull(params, version);
  version = group.pushPull(params, version);
  EXPECT_EQ(version, 2);
  const std::vector<double> after = parallel::testing::flatValues(params);
  for (size_t i = 0; i < after.size(); i += 997)
    EXPECT_NEAR(after[i], before[i] - 0.4, 1e-5) << "value " << i;
  // What the worker read in place is what the servers hold.
  auto viaTcp = makeMlp();
  ServerGroup chief({ClientRole::Chief, 0, Compression::None, kToken, std::chrono::seconds(30),
                     false},
                    placement, job.addresses());
  chief.pull(viaTcp->namedParameters());
  EXPECT_EQ(parallel::testing::flatValues(viaTcp->namedParameters()), after);
  // The pull and both pushes were answered in place.
  for (int s = 0; s < 2; ++s) {
    EXPECT_EQ(job.server(s).stats().valuesInPlace, 3);
    EXPECT_EQ(job.server(s).stats().pushes, 2);
  }
}

}  // namespace
}  // namespace kolo::parallel::ps::testing
