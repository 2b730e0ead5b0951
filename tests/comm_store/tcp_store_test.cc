// What only the TCP store must do: refuse a wrong token while good clients carry on,
// close connections that send oversized, unauthenticated or garbled requests, serve IPv4
// and IPv6, and turn a server that vanishes into PeerError on the client instead of a hang;
// a host store in front of a root: the root sees a few connections and batched requests,
// and a root that vanishes closes the host's ranks' connections.
#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <future>
#include <thread>

#include "comm/store/tcp_wire.h"
#include "kolo/comm/stores.h"
#include "kolo/error.h"
#include "support/reserved_port.h"

namespace kolo::comm {
namespace {

using namespace std::chrono_literals;
using detail::StoreOp;
using detail::WireWriter;

constexpr char kToken[] = "the-job-token-0123456789";

std::string loopback(const TcpStoreServer& server) {
  return "127.0.0.1:" + std::to_string(server.port());
}

/// A raw connection to speak (or garble) the protocol by hand.
class RawSocket {
 public:
  explicit RawSocket(uint16_t port) {
    fd_ = ::socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_port = htons(port);
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    EXPECT_EQ(::connect(fd_, reinterpret_cast<sockaddr*>(&addr), sizeof addr), 0);
  }
  ~RawSocket() { ::close(fd_); }
  void send(const Bytes& bytes) { ::send(fd_, bytes.data(), bytes.size(), MSG_NOSIGNAL); }
  /// True when the server closed the connection (EOF or reset) within 30 s; reads and
  /// drops anything the server sends first.
  bool closedByServer() {
    for (;;) {
      pollfd p{fd_, POLLIN, 0};
      if (::poll(&p, 1, 30000) <= 0) return false;
      uint8_t buf[256];
      ssize_t n = ::recv(fd_, buf, sizeof buf, 0);
      if (n <= 0) return true;
    }
  }
  /// Reads one whole reply frame and returns its status byte (-1 on closure).
  int replyStatus() {
    uint32_t length = 0;
    if (!readFully(&length, 4) || length == 0 || length > (1u << 20)) return -1;
    std::vector<uint8_t> body(length);
    if (!readFully(body.data(), length)) return -1;
    return body[0];
  }

 private:
  bool readFully(void* out, size_t size) {
    auto* p = static_cast<uint8_t*>(out);
    for (size_t got = 0; got < size;) {
      ssize_t n = ::recv(fd_, p + got, size - got, 0);
      if (n <= 0) return false;
      got += static_cast<size_t>(n);
    }
    return true;
  }
  int fd_ = -1;
};

Bytes helloFrame(const std::string& token) {
  return WireWriter()
      .u8(static_cast<uint8_t>(StoreOp::Hello))
      .u32(detail::kTcpStoreMagic)
      .u8(detail::kTcpStoreVersion)
      .str(token)
      .finish();
}

class TcpStoreTest : public ::testing::Test {
 protected:
  TcpStoreServer server_{TcpStoreServerOptions{"127.0.0.1", 0, kToken}};
  std::shared_ptr<Store> good_ = connectTcpStore(loopback(server_), kToken, 10s);

  /// The good client keeps being served after whatever a bad peer did.
  void expectGoodClientWorks(const std::string& key) {
    good_->setString(key, "value-" + key);
    EXPECT_EQ(good_->getString(key, 5s), "value-" + key);
    EXPECT_EQ(good_->add(key + "-n", 2), 2);
  }
};

TEST_F(TcpStoreTest, WrongTokenIsRefusedWhileGoodClientKeepsWorking) {
  good_->setString("before", "1");
  EXPECT_THROW(connectTcpStore(loopback(server_), "wrong-token", 5s), IoError);
  EXPECT_THROW(connectTcpStore(loopback(server_), "", 5s), IoError);
  EXPECT_THROW(connectTcpStore(loopback(server_), std::string(kToken) + "x", 5s), IoError);
  EXPECT_EQ(server_.rejectedConnections(), 3u);
  expectGoodClientWorks("after");
  EXPECT_EQ(good_->getString("before", 1s), "1");
}

TEST_F(TcpStoreTest, RequestBeforeTokenClosesConnection) {
  RawSocket raw(server_.port());
  raw.send(WireWriter().u8(static_cast<uint8_t>(StoreOp::Set)).str("stolen").str("x").finish());
  EXPECT_TRUE(raw.closedByServer());
  EXPECT_FALSE(good_->check({"stolen"}));
  expectGoodClientWorks("k1");
}

TEST_F(TcpStoreTest, OversizedUnauthenticatedFrameClosesConnection) {
  RawSocket raw(server_.port());
  uint32_t huge = 1u << 20;  // far above a Hello's room
  Bytes header(4);
  std::memcpy(header.data(), &huge, 4);
  raw.send(header);
  EXPECT_TRUE(raw.closedByServer());
  expectGoodClientWorks("k2");
}

TEST_F(TcpStoreTest, OversizedAuthenticatedFrameClosesConnection) {
  RawSocket raw(server_.port());
  raw.send(helloFrame(kToken));
  EXPECT_EQ(raw.replyStatus(), 0);
  uint32_t huge = static_cast<uint32_t>(kMaxStoreValueBytes + kMaxStoreKeyBytes + 1024);
  Bytes header(4);
  std::memcpy(header.data(), &huge, 4);
  raw.send(header);
  EXPECT_TRUE(raw.closedByServer());
  expectGoodClientWorks("k3");
}

TEST_F(TcpStoreTest, OversizedKeyInsideFrameClosesConnection) {
  RawSocket raw(server_.port());
  raw.send(helloFrame(kToken));
  EXPECT_EQ(raw.replyStatus(), 0);
  raw.send(WireWriter()
               .u8(static_cast<uint8_t>(StoreOp::Set))
               .str(std::string(kMaxStoreKeyBytes + 1, 'k'))
               .str("v")
               .finish());
  EXPECT_TRUE(raw.closedByServer());
  expectGoodClientWorks("k4");
}

TEST_F(TcpStoreTest, GarbageAndMalformedRequestsCloseConnection) {
  {
    RawSocket raw(server_.port());
    raw.send(Bytes{'G', 'E', 'T', ' ', '/', ' ', 'H', 'T', 'T', 'P', '/', '1', '.', '1', '\r', '\n',
                   '\r', '\n'});
    EXPECT_TRUE(raw.closedByServer());
  }
  {
    // A field length that runs past the end of its frame.
    RawSocket raw(server_.port());
    raw.send(helloFrame(kToken));
    EXPECT_EQ(raw.replyStatus(), 0);
    WireWriter w;
    w.u8(static_cast<uint8_t>(StoreOp::Set)).u32(1000).u8('a');
    raw.send(w.finish());
    EXPECT_TRUE(raw.closedByServer());
  }
  {
    // An unknown opcode.
    RawSocket raw(server_.port());
    raw.send(helloFrame(kToken));
    EXPECT_EQ(raw.replyStatus(), 0);
    raw.send(WireWriter().u8(99).finish());
    EXPECT_TRUE(raw.closedByServer());
  }
  {
    // A Hello with the wrong magic, even with the right token.
    RawSocket raw(server_.port());
    raw.send(WireWriter()
                 .u8(static_cast<uint8_t>(StoreOp::Hello))
                 .u32(0x12345678)
                 .u8(1)
                 .str(kToken)
                 .finish());
    EXPECT_TRUE(raw.closedByServer());
  }
  EXPECT_EQ(server_.rejectedConnections(), 4u);
  expectGoodClientWorks("k5");
}

TEST_F(TcpStoreTest, CompareSetSwapsOnlyFromTheExpectedValue) {
  auto& client = dynamic_cast<TcpStoreClient&>(*good_);
  const Bytes empty, one{'1'}, two{'2'};
  EXPECT_EQ(client.compareSet("cas", one, two), empty);  // missing: holds "" only
  EXPECT_EQ(client.compareSet("cas", empty, one), one);  // missing and expected "": set
  EXPECT_EQ(client.compareSet("cas", two, empty), one);  // holds "1", not "2": unchanged
  EXPECT_EQ(client.compareSet("cas", one, two), two);
  EXPECT_EQ(good_->getString("cas", 1s), "2");
}

TEST_F(TcpStoreTest, RepliesAfterAReplyPastOneMebibyteAreSent) {
  // A reply big enough for the server to give its buffer back afterwards (a federated
  // update, say) must not stop the replies that follow it on the same connection.
  const Bytes big(3u << 20, 'x');
  good_->set("big", big);
  for (int i = 0; i < 3; ++i) {
    EXPECT_EQ(good_->get("big", 10s), big);
    good_->set("small" + std::to_string(i), Bytes{'s'});
    EXPECT_EQ(good_->getString("small" + std::to_string(i), 10s), "s");
  }
}

TEST_F(TcpStoreTest, BarrierOfManyClientsIsAnsweredWhenTheLastArrives) {
  // Every arrival is parked in the server until the last: none may be answered early.
  constexpr int kClients = 64;
  std::vector<std::shared_ptr<Store>> clients;
  for (int i = 0; i < kClients; ++i) clients.push_back(connectTcpStore(loopback(server_), kToken, 10s));
  std::atomic<int> released{0};
  std::vector<std::thread> waiters;
  for (int i = 0; i < kClients - 1; ++i)
    waiters.emplace_back([&, i] {
      clients[static_cast<size_t>(i)]->arrive("all", kClients, 30s);
      released.fetch_add(1);
    });
  // The parked arrivals are counted before the last one comes.
  for (int spins = 0; good_->add("all", 0) < kClients - 1; ++spins) {
    ASSERT_LT(spins, 30'000) << "arrivals did not reach the server";
    std::this_thread::sleep_for(1ms);
  }
  EXPECT_EQ(released.load(), 0);
  EXPECT_EQ(clients.back()->arrive("all", kClients, 30s), kClients);
  for (auto& t : waiters) t.join();
  EXPECT_EQ(released.load(), kClients - 1);
  expectGoodClientWorks("after-barrier");
}

TEST_F(TcpStoreTest, PipelinedRequestsBehindAParkedOneAreServedInOrder) {
  RawSocket raw(server_.port());
  raw.send(helloFrame(kToken));
  EXPECT_EQ(raw.replyStatus(), 0);
  // A get that parks, then a set and a multi-get sent before its reply.
  Bytes frames = WireWriter().u8(static_cast<uint8_t>(StoreOp::Get)).str("later").u64(10'000).finish();
  const Bytes set = WireWriter().u8(static_cast<uint8_t>(StoreOp::Set)).str("mine").str("v").finish();
  const Bytes multi =
      WireWriter().u8(static_cast<uint8_t>(StoreOp::MultiGet)).u32(1).str("mine").u64(10'000).finish();
  frames.insert(frames.end(), set.begin(), set.end());
  frames.insert(frames.end(), multi.begin(), multi.end());
  raw.send(frames);
  std::this_thread::sleep_for(50ms);
  EXPECT_FALSE(good_->check({"mine"}));  // still behind the parked get
  good_->setString("later", "now");
  EXPECT_EQ(raw.replyStatus(), 0);  // the get
  EXPECT_EQ(raw.replyStatus(), 0);  // the set
  EXPECT_EQ(raw.replyStatus(), 0);  // the multi-get
  EXPECT_EQ(good_->getString("mine", 1s), "v");
}

TEST_F(TcpStoreTest, StoppedServerTurnsBlockedGetIntoPeerError) {
  auto pending = std::async(std::launch::async, [&] { return good_->get("never", 60s); });
  std::this_thread::sleep_for(100ms);  // let the request reach the server (either way it must fail)
  server_.stop();
  EXPECT_THROW(pending.get(), PeerError);
  EXPECT_THROW(good_->setString("x", "y"), IoError);
}

TEST(TcpStoreProcessTest, KilledServerProcessGivesClientPeerError) {
  int pipeFds[2];
  ASSERT_EQ(::pipe(pipeFds), 0);
  pid_t child = ::fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    TcpStoreServer server(TcpStoreServerOptions{"127.0.0.1", 0, kToken});
    uint16_t port = server.port();
    [[maybe_unused]] ssize_t n = ::write(pipeFds[1], &port, sizeof port);
    for (;;) ::pause();
  }
  uint16_t port = 0;
  ASSERT_EQ(::read(pipeFds[0], &port, sizeof port), static_cast<ssize_t>(sizeof port));
  auto client = connectTcpStore("127.0.0.1:" + std::to_string(port), kToken, 10s);
  client->setString("alive", "1");
  auto pending = std::async(std::launch::async, [&] { return client->get("never", 120s); });
  std::this_thread::sleep_for(100ms);  // let the request reach the server (either way it must fail)
  ::kill(child, SIGKILL);
  ::waitpid(child, nullptr, 0);
  // The server's connection goes with its process: a broken peer, naming the server.
  try {
    pending.get();
    ADD_FAILURE() << "no error from a store whose server was killed";
  } catch (const PeerError& e) {
    EXPECT_NE(std::string(e.what()).find("127.0.0.1:" + std::to_string(port)), std::string::npos) << e.what();
  }
  ::close(pipeFds[0]);
  ::close(pipeFds[1]);
}

TEST(TcpStoreAddressTest, WildcardServerAcceptsIpv4AndIpv6Clients) {
  TcpStoreServer server(TcpStoreServerOptions{"", 0, kToken});
  auto v4 = connectTcpStore("127.0.0.1:" + std::to_string(server.port()), kToken, 5s);
  v4->setString("family", "v4");
  std::shared_ptr<Store> v6;
  try {
    v6 = connectTcpStore("[::1]:" + std::to_string(server.port()), kToken, 2s);
  } catch (const IoError& e) {
    GTEST_SKIP() << "IPv6 loopback unavailable here: " << e.what();
  }
  EXPECT_EQ(v6->getString("family", 1s), "v4");
  EXPECT_EQ(static_cast<TcpStoreClient&>(*v6).localAddress(), "::1");
  EXPECT_EQ(static_cast<TcpStoreClient&>(*v4).localAddress(), "127.0.0.1");
}

TEST(TcpStoreAddressTest, Ipv6OnlyServer) {
  std::unique_ptr<TcpStoreServer> server;
  try {
    server = std::make_unique<TcpStoreServer>(TcpStoreServerOptions{"::1", 0, kToken});
  } catch (const IoError& e) {
    GTEST_SKIP() << "cannot listen on ::1 here: " << e.what();
  }
  auto client = connectTcpStore("[::1]:" + std::to_string(server->port()), kToken, 5s);
  EXPECT_EQ(client->add("n", 4), 4);
}

TEST(TcpStoreAddressTest, ClientRetriesUntilServerStarts) {
  // The reserved port refuses connections until the server listens on it, so the client
  // keeps retrying. The pause only makes a refused first attempt likely: wherever the client
  // is in its retries when the server comes up, it must connect.
  const testing::ReservedPort port;
  auto client = std::async(std::launch::async, [&] {
    return connectTcpStore(port.address(), kToken, 30s);
  });
  std::this_thread::sleep_for(200ms);
  TcpStoreServer server(TcpStoreServerOptions{"127.0.0.1", port.port(), kToken});
  EXPECT_EQ(client.get()->add("late", 1), 1);
}

TEST(TcpStoreAddressTest, UnreachableServerThrowsIoErrorAfterConnectTimeout) {
  // Nobody listens on a reserved port, and nobody else can take it while it is held.
  const testing::ReservedPort port;
  EXPECT_THROW(connectTcpStore(port.address(), kToken, 200ms), IoError);
}

TEST_F(TcpStoreTest, GetAvailableAnswersWhatExistsOnceAnyKeyDoes) {
  auto& client = dynamic_cast<TcpStoreClient&>(*good_);
  // Nothing there: the deadline answers "none present", not a Timeout.
  auto none = client.getAvailable({"ga/a", "ga/b"}, 50ms);
  ASSERT_EQ(none.size(), 2u);
  EXPECT_FALSE(none[0] || none[1]);
  auto other = connectTcpStore(loopback(server_), kToken, 10s);
  std::thread setter([&] {
    std::this_thread::sleep_for(30ms);
    other->setString("ga/b", "bee");
  });
  auto some = client.getAvailable({"ga/a", "ga/b"}, 30s);
  setter.join();
  EXPECT_FALSE(some[0]);
  ASSERT_TRUE(some[1]);
  EXPECT_EQ(*some[1], (Bytes{'b', 'e', 'e'}));
  // Several arrivals in one request: it waits for the fifth like four ranks would.
  auto four =
      std::async(std::launch::async, [&] { return client.arriveMany("ga/barrier", 5, 4, 30s); });
  for (int spins = 0; other->add("ga/barrier", 0) < 4; ++spins) {
    ASSERT_LT(spins, 30'000) << "the arrivals did not reach the server";
    std::this_thread::sleep_for(1ms);
  }
  EXPECT_EQ(other->arrive("ga/barrier", 5, 30s), 5);
  EXPECT_EQ(four.get(), 4);
  EXPECT_THROW(client.arriveMany("ga/barrier", 5, 0, 1s), InvalidArgument);
}

/// A host store forwarding to server_, as `kolo run` hosts one per host.
TcpStoreServerOptions hostStoreOptions(const TcpStoreServer& root) {
  TcpStoreServerOptions options{"127.0.0.1", 0, kToken};
  options.upstream = loopback(root);
  options.upstreamTimeout = 10s;
  return options;
}

TEST_F(TcpStoreTest, HostStoreGivesTheRootAFewConnectionsAndBatchedRequests) {
  constexpr int kRanks = 48;
  const TcpStoreServerStats before = server_.stats();
  TcpStoreServer host(hostStoreOptions(server_));
  std::vector<std::shared_ptr<Store>> ranks;
  for (int r = 0; r < kRanks; ++r) ranks.push_back(connectTcpStore(loopback(host), kToken, 10s));
  // What a rendezvous does: publish, read both ring neighbours, a barrier, a counter.
  std::vector<std::thread> threads;
  std::vector<int64_t> arrivals(kRanks), counts(kRanks);
  std::vector<std::string> seen(kRanks);
  for (int r = 0; r < kRanks; ++r)
    threads.emplace_back([&, r] {
      Store& store = *ranks[static_cast<size_t>(r)];
      store.setString("rank/" + std::to_string(r), "addr-" + std::to_string(r));
      const auto peers = store.multiGet({"rank/" + std::to_string((r + kRanks - 1) % kRanks),
                                         "rank/" + std::to_string((r + 1) % kRanks)},
                                        30s);
      seen[static_cast<size_t>(r)] = std::string(peers[0].begin(), peers[0].end()) + " " +
                                     std::string(peers[1].begin(), peers[1].end());
      arrivals[static_cast<size_t>(r)] = store.arrive("barrier", kRanks, 30s);
      counts[static_cast<size_t>(r)] = store.add("steps", 1);
    });
  for (auto& t : threads) t.join();
  for (int r = 0; r < kRanks; ++r)
    EXPECT_EQ(seen[static_cast<size_t>(r)], "addr-" + std::to_string((r + kRanks - 1) % kRanks) +
                                                " addr-" + std::to_string((r + 1) % kRanks));
  // Every rank has its own arrival number and its own counter value, as from the root.
  std::sort(arrivals.begin(), arrivals.end());
  std::sort(counts.begin(), counts.end());
  for (int r = 0; r < kRanks; ++r) {
    EXPECT_EQ(arrivals[static_cast<size_t>(r)], r + 1);
    EXPECT_EQ(counts[static_cast<size_t>(r)], r + 1);
  }
  EXPECT_EQ(good_->getString("rank/7", 1s), "addr-7");
  const TcpStoreServerStats after = server_.stats();
  // Batches, watcher, one barrier connection: three, not 48.
  EXPECT_EQ(after.connections - before.connections, 3u);
  EXPECT_GE(host.stats().connections, uint64_t{kRanks});
  // Each rank made 5 requests of its own (Hello included); the root got fewer in all,
  // whatever the batches were (at worst one batch per request after the Hellos).
  EXPECT_LE(after.requests - before.requests, host.stats().requests);
}

TEST_F(TcpStoreTest, HostStoreClosesItsRanksConnectionsWhenTheRootIsLost) {
  auto root = std::make_unique<TcpStoreServer>(TcpStoreServerOptions{"127.0.0.1", 0, kToken});
  TcpStoreServerOptions options{"127.0.0.1", 0, kToken};
  options.upstream = loopback(*root);
  options.upstreamTimeout = 10s;
  TcpStoreServer host(options);
  auto rank = connectTcpStore(loopback(host), kToken, 10s);
  rank->setString("before", "1");
  auto waiting = std::async(std::launch::async, [&] { return rank->get("never", 60s); });
  std::this_thread::sleep_for(50ms);
  root->stop();
  EXPECT_THROW(waiting.get(), PeerError);
  // A wrong token is refused by the host store itself.
  EXPECT_THROW(connectTcpStore(loopback(host), "wrong-token", 5s), IoError);
}

TEST(HostPortTest, ParsesIpv4Ipv6AndNames) {
  HostPort a = parseHostPort("10.0.0.1:29500");
  EXPECT_EQ(a.host, "10.0.0.1");
  EXPECT_EQ(a.port, 29500);
  HostPort b = parseHostPort("[fe80::1%eth0]:80");
  EXPECT_EQ(b.host, "fe80::1%eth0");
  EXPECT_EQ(b.port, 80);
  EXPECT_EQ(b.toString(), "[fe80::1%eth0]:80");
  EXPECT_EQ(parseHostPort("node-3.cluster:1").toString(), "node-3.cluster:1");
  EXPECT_THROW(parseHostPort("nohost"), InvalidArgument);
  EXPECT_THROW(parseHostPort("::1:80"), InvalidArgument);
  EXPECT_THROW(parseHostPort("host:99999"), InvalidArgument);
  EXPECT_THROW(parseHostPort("host:"), InvalidArgument);
  EXPECT_THROW(parseHostPort(":80"), InvalidArgument);
}

}  // namespace
}  // namespace kolo::comm
