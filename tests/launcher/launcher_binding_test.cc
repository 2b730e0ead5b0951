// CPU binding of local ranks: `kolo run` starts each rank bound to one CPU of its own
// allowed set (round robin), respects a narrower mask given to the launcher, and leaves
// the mask alone with --bind none; plus the choice function itself.
#include <gtest/gtest.h>

#include <map>
#include <regex>

#include "comm/affinity.h"
#include "kolo/error.h"
#include "launcher/process_helpers.h"

namespace kolo {
namespace {

using namespace kolo::testing;

const std::string kKolo = KOLO_BINARY_DIR "/src/cli/kolo";

/// "0", "0-3", "0,2-5" -> the CPUs listed.
std::vector<int> parseCpuList(const std::string& text) {
  std::vector<int> cpus;
  std::regex item(R"((\d+)(?:-(\d+))?)");
  for (std::sregex_iterator it(text.begin(), text.end(), item), end; it != end; ++it) {
    const int lo = std::stoi((*it)[1]);
    const int hi = (*it)[2].matched ? std::stoi((*it)[2]) : lo;
    for (int c = lo; c <= hi; ++c) cpus.push_back(c);
  }
  return cpus;
}

/// Runs `kolo run -n N EXTRA... -- sh -c 'grep Cpus_allowed_list ...'` and returns each
/// rank's allowed CPUs (as the kernel reports them for the rank's own process).
std::map<int, std::vector<int>> rankCpus(int n, const std::vector<std::string>& extra) {
  std::vector<std::string> args = {kKolo, "run", "-n", std::to_string(n)};
  args.insert(args.end(), extra.begin(), extra.end());
  for (const char* word : {"--", "sh", "-c", "grep Cpus_allowed_list: /proc/self/status"})
    args.push_back(word);
  Result r = runProgram(args, cleanEnvironment({}));
  EXPECT_EQ(r.exitCode(), 0) << r.err;
  std::map<int, std::vector<int>> cpus;
  std::regex line(R"(\[rank (\d+)\] Cpus_allowed_list:\s*(\S+))");
  for (const auto& text : splitLines(r.out)) {
    std::smatch m;
    EXPECT_TRUE(std::regex_match(text, m, line)) << text;
    if (!m.empty()) cpus[std::stoi(m[1])] = parseCpuList(m[2]);
  }
  EXPECT_EQ(cpus.size(), static_cast<size_t>(n)) << r.out;
  return cpus;
}

TEST(CpuBinding, ChoiceIsRoundRobinOverTheAllowedSet) {
  const std::vector<int> allowed = {2, 5, 7};
  EXPECT_EQ(comm::cpuForLocalRank(comm::CpuBinding::Core, 0, allowed), 2);
  EXPECT_EQ(comm::cpuForLocalRank(comm::CpuBinding::Core, 2, allowed), 7);
  EXPECT_EQ(comm::cpuForLocalRank(comm::CpuBinding::Core, 4, allowed), 5);
  EXPECT_EQ(comm::cpuForLocalRank(comm::CpuBinding::None, 1, allowed), -1);
  EXPECT_EQ(comm::parseCpuBinding("core"), comm::CpuBinding::Core);
  EXPECT_EQ(comm::parseCpuBinding("none"), comm::CpuBinding::None);
  EXPECT_THROW(comm::parseCpuBinding("socket"), InvalidArgument);
}

TEST(CpuBinding, KoloRunBindsEachRankToOneCpu) {
  const std::vector<int> allowed = comm::allowedCpus();
  ASSERT_FALSE(allowed.empty());
  const int n = 3;  // more ranks than CPUs on small machines: they wrap around
  auto cpus = rankCpus(n, {});
  for (int rank = 0; rank < n; ++rank) {
    EXPECT_EQ(cpus[rank], std::vector<int>{allowed[static_cast<size_t>(rank) % allowed.size()]})
        << "rank " << rank;
  }
}

TEST(CpuBinding, KoloRunRespectsANarrowerLauncherMask) {
  const std::vector<int> allowed = comm::allowedCpus();
  ASSERT_FALSE(allowed.empty());
  const int only = allowed.back();
  std::map<int, std::vector<int>> cpus;
  {
    // The launcher inherits this thread's mask: one CPU, so every rank lands on it.
    comm::ScopedThreadBinding narrow(only);
    cpus = rankCpus(2, {"--bind", "core"});
  }
  EXPECT_EQ(comm::allowedCpus(), allowed);  // restored
  for (int rank = 0; rank < 2; ++rank)
    EXPECT_EQ(cpus[rank], std::vector<int>{only}) << "rank " << rank;
}

TEST(CpuBinding, ALoneRankKeepsTheLauncherMask) {
  const std::vector<int> allowed = comm::allowedCpus();
  auto cpus = rankCpus(1, {});
  EXPECT_EQ(cpus[0], allowed);
}

TEST(CpuBinding, BindNoneLeavesTheLauncherMask) {
  const std::vector<int> allowed = comm::allowedCpus();
  auto cpus = rankCpus(2, {"--bind", "none"});
  for (int rank = 0; rank < 2; ++rank) EXPECT_EQ(cpus[rank], allowed) << "rank " << rank;
}

}  // namespace
}  // namespace kolo
