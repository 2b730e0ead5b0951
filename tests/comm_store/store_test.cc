// The Store contract, checked against every implementation (memory, file, TCP, and TCP
// through a host store that forwards to a root store) through one
// parameterised suite: set/get/wait/add/remove/check and the bulk operations (multi-get,
// multi-set, check-each, the counter barrier), blocking until a key appears,
// deadlines that throw Timeout naming the key, and exact totals from concurrent adds.
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <filesystem>
#include <set>
#include <thread>

#include "kolo/comm/stores.h"
#include "kolo/error.h"

namespace kolo::comm {
namespace {

using namespace std::chrono_literals;

/// A store implementation under test: `connect()` gives a new handle on the same store
/// (a new TCP connection, a new file-store object on the same directory, or the same
/// in-memory store), as separate ranks would hold.
class StoreBackend {
 public:
  virtual ~StoreBackend() = default;
  virtual std::shared_ptr<Store> connect() = 0;
};

class MemoryBackend : public StoreBackend {
 public:
  std::shared_ptr<Store> connect() override { return store_; }

 private:
  std::shared_ptr<Store> store_ = makeMemoryStore();
};

class FileBackend : public StoreBackend {
 public:
  FileBackend() {
    char pattern[] = "/tmp/kolo_file_store_XXXXXX";
    dir_ = ::mkdtemp(pattern);
  }
  ~FileBackend() override { std::filesystem::remove_all(dir_); }
  std::shared_ptr<Store> connect() override { return makeFileStore(dir_); }

 private:
  std::string dir_;
};

class TcpBackend : public StoreBackend {
 public:
  TcpBackend() : server_(TcpStoreServerOptions{"127.0.0.1", 0, "job-token"}) {}
  std::shared_ptr<Store> connect() override {
    return connectTcpStore("127.0.0.1:" + std::to_string(server_.port()), "job-token", 10s);
  }

 private:
  TcpStoreServer server_;
};

/// Ranks of one host talk to their host store, which forwards to the root in batches.
class HostStoreBackend : public StoreBackend {
 public:
  HostStoreBackend()
      : root_(TcpStoreServerOptions{"127.0.0.1", 0, "job-token"}),
        host_(hostOptions(root_.port())) {}
  std::shared_ptr<Store> connect() override {
    return connectTcpStore("127.0.0.1:" + std::to_string(host_.port()), "job-token", 10s);
  }

 private:
  static TcpStoreServerOptions hostOptions(uint16_t rootPort) {
    TcpStoreServerOptions options{"127.0.0.1", 0, "job-token"};
    options.upstream = "127.0.0.1:" + std::to_string(rootPort);
    return options;
  }
  TcpStoreServer root_;
  TcpStoreServer host_;
};

std::unique_ptr<StoreBackend> makeBackend(const std::string& name) {
  if (name == "memory") return std::make_unique<MemoryBackend>();
  if (name == "file") return std::make_unique<FileBackend>();
  if (name == "host") return std::make_unique<HostStoreBackend>();
  return std::make_unique<TcpBackend>();
}

class StoreTest : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override {
    backend_ = makeBackend(GetParam());
    store_ = backend_->connect();
  }
  std::unique_ptr<StoreBackend> backend_;
  std::shared_ptr<Store> store_;
};

TEST_P(StoreTest, SetThenGetReturnsValueAndOverwrites) {
  store_->setString("alpha", "one");
  EXPECT_EQ(store_->getString("alpha", 1s), "one");
  store_->setString("alpha", "two");
  EXPECT_EQ(backend_->connect()->getString("alpha", 1s), "two");
}

TEST_P(StoreTest, BinaryEmptyAndLargeValuesRoundTrip) {
  Bytes binary = {0, 255, 0, 10, 13, 0};
  store_->set("bin", binary);
  EXPECT_EQ(store_->get("bin", 1s), binary);
  store_->set("empty", {});
  EXPECT_TRUE(store_->get("empty", 1s).empty());
  EXPECT_TRUE(store_->check({"empty"}));
  Bytes large(3 << 20);
  for (size_t i = 0; i < large.size(); ++i) large[i] = static_cast<uint8_t>(i * 7 + i / 251);
  store_->set("large", large);
  EXPECT_EQ(backend_->connect()->get("large", 5s), large);
}

TEST_P(StoreTest, KeysWithAnyBytesAreDistinct) {
  std::string slashKey = "a/b c%2F\n";
  std::string longKey(3000, 'x');
  std::string longKey2 = longKey + "y";
  store_->setString(slashKey, "1");
  store_->setString(longKey, "2");
  store_->setString(longKey2, "3");
  EXPECT_EQ(store_->getString(slashKey, 1s), "1");
  EXPECT_EQ(store_->getString(longKey, 1s), "2");
  EXPECT_EQ(store_->getString(longKey2, 1s), "3");
  EXPECT_FALSE(store_->check({"a"}));
}

TEST_P(StoreTest, GetBlocksUntilAnotherHandleSets) {
  auto other = backend_->connect();
  std::thread setter([&] {
    std::this_thread::sleep_for(50ms);
    other->setString("late", "arrived");
  });
  EXPECT_EQ(store_->getString("late", 30s), "arrived");
  setter.join();
}

TEST_P(StoreTest, WaitReturnsWhenEveryKeyExists) {
  auto other = backend_->connect();
  std::thread setter([&] {
    other->setString("w1", "x");
    std::this_thread::sleep_for(30ms);
    other->add("w2", 1);
  });
  store_->wait({"w1", "w2"}, 30s);
  EXPECT_TRUE(store_->check({"w1", "w2"}));
  setter.join();
}

TEST_P(StoreTest, GetDeadlineThrowsTimeoutNamingTheKey) {
  try {
    store_->get("never-set-key", 100ms);
    FAIL() << "expected Timeout";
  } catch (const Timeout& e) {
    EXPECT_NE(std::string(e.what()).find("'never-set-key'"), std::string::npos) << e.what();
  }
  // The handle still works after a timeout.
  store_->setString("after", "ok");
  EXPECT_EQ(store_->getString("after", 1s), "ok");
}

TEST_P(StoreTest, WaitDeadlineNamesOnlyTheMissingKeys) {
  store_->setString("present", "1");
  try {
    store_->wait({"present", "absent-1", "absent-2"}, 100ms);
    FAIL() << "expected Timeout";
  } catch (const Timeout& e) {
    std::string what = e.what();
    EXPECT_NE(what.find("'absent-1'"), std::string::npos) << what;
    EXPECT_NE(what.find("'absent-2'"), std::string::npos) << what;
    EXPECT_EQ(what.find("'present'"), std::string::npos) << what;
  }
}

TEST_P(StoreTest, AddCountsFromZeroAndIsReadableAsText) {
  EXPECT_EQ(store_->add("counter", 5), 5);
  EXPECT_EQ(store_->add("counter", -7), -2);
  EXPECT_EQ(store_->add("counter", 0), -2);
  EXPECT_EQ(store_->getString("counter", 1s), "-2");
  store_->setString("counter2", "40");
  EXPECT_EQ(store_->add("counter2", 2), 42);
}

TEST_P(StoreTest, AddOnNonIntegerValueIsRejected) {
  store_->setString("text", "hello");
  EXPECT_THROW(store_->add("text", 1), InvalidArgument);
  EXPECT_EQ(store_->getString("text", 1s), "hello");
}

TEST_P(StoreTest, ConcurrentAddsGiveExactTotalAndDistinctResults) {
  constexpr int kThreads = 8;
  constexpr int kAddsPerThread = 150;
  std::vector<std::vector<int64_t>> seen(kThreads);
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      auto handle = backend_->connect();
      for (int i = 0; i < kAddsPerThread; ++i) seen[t].push_back(handle->add("shared", 1));
    });
  }
  for (auto& t : threads) t.join();
  std::set<int64_t> all;
  for (const auto& s : seen) all.insert(s.begin(), s.end());
  EXPECT_EQ(all.size(), size_t{kThreads * kAddsPerThread});
  EXPECT_EQ(*all.begin(), 1);
  EXPECT_EQ(*all.rbegin(), kThreads * kAddsPerThread);
  EXPECT_EQ(store_->add("shared", 0), kThreads * kAddsPerThread);
}

TEST_P(StoreTest, RemoveReportsExistenceAndCheckFollows) {
  EXPECT_TRUE(store_->check({}));
  EXPECT_FALSE(store_->remove("gone"));
  store_->setString("gone", "x");
  EXPECT_TRUE(store_->check({"gone"}));
  EXPECT_TRUE(store_->remove("gone"));
  EXPECT_FALSE(store_->check({"gone"}));
  EXPECT_FALSE(store_->remove("gone"));
  EXPECT_THROW(store_->get("gone", 20ms), Timeout);
}

TEST_P(StoreTest, InvalidKeysAndValuesAreRejectedBeforeSending) {
  EXPECT_THROW(store_->setString("", "x"), InvalidArgument);
  EXPECT_THROW(store_->setString(std::string(kMaxStoreKeyBytes + 1, 'k'), "x"), InvalidArgument);
  EXPECT_THROW(store_->set("big", Bytes(kMaxStoreValueBytes + 1)), InvalidArgument);
  store_->setString("still", "fine");
  EXPECT_EQ(store_->getString("still", 1s), "fine");
}

TEST_P(StoreTest, PrefixStoresAreIsolated) {
  auto a = prefixStore(store_, "job-a");
  auto b = prefixStore(backend_->connect(), "job-b");
  a->setString("rank0", "a0");
  b->setString("rank0", "b0");
  EXPECT_EQ(a->getString("rank0", 1s), "a0");
  EXPECT_EQ(b->getString("rank0", 1s), "b0");
  EXPECT_EQ(store_->getString("job-a/rank0", 1s), "a0");
  EXPECT_EQ(a->add("n", 3), 3);
  EXPECT_FALSE(b->check({"n"}));
  try {
    b->get("n", 20ms);
    FAIL();
  } catch (const Timeout& e) {
    EXPECT_NE(std::string(e.what()).find("job-b/n"), std::string::npos) << e.what();
  }
}

TEST_P(StoreTest, MultiGetWaitsForEveryKeyAndKeepsTheOrder) {
  auto other = backend_->connect();
  store_->setString("m/b", "bee");
  std::thread setter([&] {
    std::this_thread::sleep_for(30ms);
    other->multiSet({"m/a", "m/c"}, {Bytes{'a'}, Bytes{}});
  });
  const std::vector<Bytes> values = store_->multiGet({"m/c", "m/a", "m/b"}, 30s);
  setter.join();
  ASSERT_EQ(values.size(), 3u);
  EXPECT_EQ(values[0], Bytes{});
  EXPECT_EQ(values[1], Bytes{'a'});
  EXPECT_EQ(values[2], (Bytes{'b', 'e', 'e'}));
  EXPECT_TRUE(store_->multiGet({}, 1s).empty());
  EXPECT_THROW(store_->multiSet({"x"}, {}), InvalidArgument);
}

TEST_P(StoreTest, MultiGetDeadlineNamesOnlyTheMissingKeys) {
  store_->setString("here", "1");
  try {
    store_->multiGet({"here", "gone"}, 100ms);
    FAIL() << "expected Timeout";
  } catch (const Timeout& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("'gone'"), std::string::npos) << what;
    EXPECT_EQ(what.find("'here'"), std::string::npos) << what;
  }
}

TEST_P(StoreTest, CheckEachAnswersPerKey) {
  store_->setString("e1", "x");
  store_->add("e3", 2);
  EXPECT_EQ(store_->checkEach({"e1", "e2", "e3"}), (std::vector<bool>{true, false, true}));
  auto prefixed = prefixStore(store_, "p");
  prefixed->setString("e2", "y");
  EXPECT_EQ(prefixed->checkEach({"e1", "e2"}), (std::vector<bool>{false, true}));
}

TEST_P(StoreTest, ArriveReleasesEveryWaiterOnceTheLastArrives) {
  constexpr int kRanks = 6;
  std::vector<std::thread> ranks;
  std::vector<int64_t> arrivals(kRanks);
  std::atomic<int> released{0};
  for (int r = 0; r < kRanks; ++r) {
    ranks.emplace_back([&, r] {
      auto handle = r == 0 ? store_ : backend_->connect();
      arrivals[static_cast<size_t>(r)] = prefixStore(handle, "job")->arrive("barrier", kRanks, 30s);
      released.fetch_add(1);
    });
  }
  for (auto& t : ranks) t.join();
  EXPECT_EQ(released.load(), kRanks);
  std::sort(arrivals.begin(), arrivals.end());
  for (int r = 0; r < kRanks; ++r) EXPECT_EQ(arrivals[static_cast<size_t>(r)], r + 1);
}

TEST_P(StoreTest, ArriveDeadlineNamesTheBarrier) {
  try {
    store_->arrive("lonely", 2, 100ms);
    FAIL() << "expected Timeout";
  } catch (const Timeout& e) {
    EXPECT_NE(std::string(e.what()).find("lonely"), std::string::npos) << e.what();
  }
  // The arrival counted: a second one opens the barrier.
  EXPECT_EQ(backend_->connect()->arrive("lonely", 2, 1s), 2);
}

TEST_P(StoreTest, AddsFromForkedProcessesGiveExactTotal) {
  if (GetParam() == "memory") GTEST_SKIP() << "the memory store lives in one process";
  constexpr int kChildren = 4;
  constexpr int kAdds = 50;
  std::vector<pid_t> children;
  for (int c = 0; c < kChildren; ++c) {
    pid_t pid = ::fork();
    ASSERT_GE(pid, 0);
    if (pid == 0) {
      int code = 0;
      try {
        auto handle = backend_->connect();
        for (int i = 0; i < kAdds; ++i) handle->add("procs", 1);
      } catch (...) {
        code = 1;
      }
      ::_exit(code);
    }
    children.push_back(pid);
  }
  for (pid_t pid : children) {
    int status = 0;
    ASSERT_EQ(::waitpid(pid, &status, 0), pid);
    EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0);
  }
  EXPECT_EQ(store_->add("procs", 0), kChildren * kAdds);
}

INSTANTIATE_TEST_SUITE_P(AllStores, StoreTest, ::testing::Values("memory", "file", "tcp", "host"),
                         [](const auto& info) { return info.param; });

TEST(FileStoreTest, UnusableDirectoryThrowsIoError) {
  EXPECT_THROW(makeFileStore("/proc/kolo-cannot-create-this"), IoError);
}

}  // namespace
}  // namespace kolo::comm
