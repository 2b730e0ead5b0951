// Encoding and strict decoding of the rendezvous records (rank_record.h). Numbers are
// plain decimal with nothing around them; every count and size is bounded before it is
// used, so a hostile record costs at most its own length.
#include "comm/native/rank_record.h"

#include <charconv>
#include <limits>
#include <string_view>
#include <utility>

#include "kolo/error.h"

namespace kolo::comm::native {

namespace {

/// Parses all of `text` as a decimal number in [low, high]; false otherwise.
template <class T>
bool parseNumber(std::string_view text, T low, T high, T& out) {
  // from_chars takes no '+' or whitespace; a '-' only where negative values are allowed.
  if (text.empty() || (text.front() == '-' && std::cmp_greater_equal(low, 0))) return false;
  T value{};
  const auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), value);
  if (ec != std::errc() || end != text.data() + text.size() || value < low || value > high) return false;
  out = value;
  return true;
}

/// Splits the record into lines; a final newline ends the last line rather than starting
/// an empty one.
std::vector<std::string_view> splitLines(std::string_view text) {
  std::vector<std::string_view> lines;
  while (!text.empty()) {
    const size_t end = text.find('\n');
    if (end == std::string_view::npos) {
      lines.push_back(text);
      break;
    }
    lines.push_back(text.substr(0, end));
    text.remove_prefix(end + 1);
  }
  return lines;
}

std::string shown(std::string_view text) {
  constexpr size_t kShown = 40;
  std::string out;
  for (char c : text.substr(0, kShown)) out += (c >= 0x20 && c < 0x7f) ? c : '?';
  if (text.size() > kShown) out += "...";
  return out;
}

constexpr size_t kFixedLines = 6;  // host id, pid, port, probe address, probe value, cpus

/// Why `record` cannot be encoded so that it decodes to itself; empty when it can.
std::string rankRecordProblem(const RankRecord& r) {
  if (r.hostId.empty() || r.hostId.size() > kMaxHostIdBytes || r.hostId.find('\n') != std::string::npos)
    return "host id '" + shown(r.hostId) + "' is empty, longer than " + std::to_string(kMaxHostIdBytes) +
           " bytes or holds a newline";
  if (r.pid < 1) return "pid " + std::to_string(r.pid) + " is not positive";
  if (r.port < 1 || r.port > 65535) return "port " + std::to_string(r.port) + " is outside 1..65535";
  if (r.cpus.size() > kMaxRecordCpus)
    return std::to_string(r.cpus.size()) + " cpus, more than " + std::to_string(kMaxRecordCpus);
  for (int c : r.cpus)
    if (c < 0 || c >= kMaxCpuId) return "cpu id " + std::to_string(c) + " is outside 0.." + std::to_string(kMaxCpuId - 1);
  if (r.addresses.empty()) return "no address";
  if (r.addresses.size() > kMaxRecordAddresses)
    return std::to_string(r.addresses.size()) + " addresses, more than " + std::to_string(kMaxRecordAddresses);
  for (const auto& a : r.addresses)
    if (a.empty() || a.size() > kMaxAddressBytes || a.find('\n') != std::string::npos)
      return "address '" + shown(a) + "' is empty, longer than " + std::to_string(kMaxAddressBytes) +
             " bytes or holds a newline";
  return "";
}

}  // namespace

std::string encodeRankRecord(const RankRecord& record) {
  if (const std::string problem = rankRecordProblem(record); !problem.empty())
    KOLO_THROW(InvalidArgument, "cannot publish a rendezvous record: ", problem);
  std::string out = record.hostId + "\n" + std::to_string(record.pid) + "\n" + std::to_string(record.port) + "\n" +
                    std::to_string(record.probeAddress) + "\n" + std::to_string(record.probeValue) + "\n";
  for (size_t i = 0; i < record.cpus.size(); ++i) {
    if (i) out += ',';
    out += std::to_string(record.cpus[i]);
  }
  out += '\n';
  for (const auto& a : record.addresses) out += a + "\n";
  return out;
}

RankRecord decodeRankRecord(const std::string& text, int rank) {
  auto malformed = [rank](const auto&... what) {
    KOLO_THROW(FormatError, "rendezvous record of rank ", rank, " is malformed: ", what...);
  };
  if (text.size() > kMaxRecordBytes) malformed(text.size(), " bytes, more than ", kMaxRecordBytes);
  const std::vector<std::string_view> lines = splitLines(text);
  if (lines.size() < kFixedLines + 1)
    malformed(lines.size(), " lines, fewer than the ", kFixedLines, " fields and one address");
  RankRecord record;
  record.hostId = std::string(lines[0]);
  if (!parseNumber(lines[1], 1, std::numeric_limits<int>::max(), record.pid))
    malformed("pid '", shown(lines[1]), "' is not a number from 1 up");
  if (!parseNumber(lines[2], 1, 65535, record.port)) malformed("port '", shown(lines[2]), "' is not in 1..65535");
  const uint64_t anyWord = std::numeric_limits<uint64_t>::max();
  if (!parseNumber<uint64_t>(lines[3], 0, anyWord, record.probeAddress))
    malformed("probe address '", shown(lines[3]), "' is not a number");
  if (!parseNumber<uint64_t>(lines[4], 0, anyWord, record.probeValue))
    malformed("probe value '", shown(lines[4]), "' is not a number");
  std::string_view cpus = lines[5];
  while (!cpus.empty()) {
    const size_t comma = cpus.find(',');
    const std::string_view item = cpus.substr(0, comma);
    if (record.cpus.size() == kMaxRecordCpus) malformed("more than ", kMaxRecordCpus, " cpus");
    int cpu = 0;
    if (!parseNumber(item, 0, kMaxCpuId - 1, cpu))
      malformed("cpu '", shown(item), "' is not a number in 0..", kMaxCpuId - 1);
    record.cpus.push_back(cpu);
    if (comma == std::string_view::npos) break;
    cpus.remove_prefix(comma + 1);
    if (cpus.empty()) malformed("the cpu list ends with a comma");
  }
  for (size_t i = kFixedLines; i < lines.size(); ++i) {
    if (record.addresses.size() == kMaxRecordAddresses) malformed("more than ", kMaxRecordAddresses, " addresses");
    record.addresses.emplace_back(lines[i]);
  }
  if (const std::string problem = rankRecordProblem(record); !problem.empty()) malformed(problem);
  return record;
}

std::string encodeHostSegmentRecord(const HostSegmentRecord& record) {
  if (!record.error.empty()) return "error " + record.error;
  if (record.pid < 1 || record.fd < 0)
    KOLO_THROW(InvalidArgument, "cannot publish a host segment record with pid ", record.pid, " and fd ", record.fd);
  return std::to_string(record.pid) + " " + std::to_string(record.fd);
}

HostSegmentRecord decodeHostSegmentRecord(const std::string& text, int rank) {
  HostSegmentRecord record;
  const std::string_view view(text);
  constexpr std::string_view kError = "error ";
  if (view.substr(0, kError.size()) == kError) {
    record.error = text.substr(kError.size());
    if (record.error.empty())
      KOLO_THROW(FormatError, "rendezvous on rank ", rank, ": the host segment record is an error without a message");
    return record;
  }
  const size_t space = view.find(' ');
  const int intMax = std::numeric_limits<int>::max();
  if (space == std::string_view::npos || !parseNumber(view.substr(0, space), 1, intMax, record.pid) ||
      !parseNumber(view.substr(space + 1), 0, intMax, record.fd))
    KOLO_THROW(FormatError, "rendezvous on rank ", rank, ": bad host segment record '", shown(view),
               "' (expected '<pid> <fd>' or 'error <message>')");
  return record;
}

namespace {

void putWord(std::string& out, uint32_t value) {
  for (int i = 0; i < 4; ++i) out += static_cast<char>((value >> (8 * i)) & 0xffu);
}

uint32_t wordAt(const std::string& bytes, size_t at) {
  uint32_t value = 0;
  for (int i = 0; i < 4; ++i) value |= uint32_t{static_cast<uint8_t>(bytes[at + static_cast<size_t>(i)])} << (8 * i);
  return value;
}

}  // namespace

std::string encodeHostTable(const std::vector<uint32_t>& hostOf) {
  // The runs first, then runs of equal length on consecutive hosts merged into one group.
  std::vector<HostRun> runs;
  uint32_t hosts = 0;
  for (size_t r = 0; r < hostOf.size();) {
    const uint32_t host = hostOf[r];
    if (host > hosts) KOLO_THROW(InvalidArgument, "host table: rank ", r, " is on host ", host, " before host ", hosts);
    if (host == hosts) ++hosts;
    size_t end = r + 1;
    while (end < hostOf.size() && hostOf[end] == host) ++end;
    runs.push_back(HostRun{static_cast<uint32_t>(r), static_cast<uint32_t>(end - r), host});
    r = end;
  }
  std::string out;
  for (size_t g = 0; g < runs.size();) {
    size_t end = g + 1;
    while (end < runs.size() && runs[end].count == runs[g].count &&
           runs[end].host == runs[g].host + static_cast<uint32_t>(end - g))
      ++end;
    putWord(out, runs[g].count);
    putWord(out, runs[g].host);
    putWord(out, static_cast<uint32_t>(end - g));
    g = end;
  }
  return out;
}

std::vector<HostRun> decodeHostRuns(const std::string& bytes, int size) {
  auto malformed = [&](const auto&... what) {
    KOLO_THROW(FormatError, "host table of ", bytes.size(), " bytes for ", size, " ranks is malformed: ", what...);
  };
  if (size < 1) malformed("no ranks");
  if (bytes.size() % 12 != 0) malformed("not a whole number of (ranks, host, runs) groups");
  if (bytes.size() / 12 > static_cast<size_t>(size)) malformed("more groups than ranks");
  std::vector<HostRun> runs;
  size_t ranks = 0;
  uint32_t hosts = 0;
  for (size_t at = 0; at < bytes.size(); at += 12) {
    const uint32_t run = wordAt(bytes, at);
    const uint32_t first = wordAt(bytes, at + 4);
    const uint32_t repeat = wordAt(bytes, at + 8);
    if (run == 0) malformed("an empty run");
    if (repeat == 0) malformed("a group of no runs");
    if (uint64_t{run} * repeat > static_cast<size_t>(size) - ranks) malformed("runs of more than ", size, " ranks");
    if (!runs.empty() && runs.back().count == run && uint64_t{runs.back().host} + 1 == first)
      malformed("a group that continues the one before it");
    for (uint32_t i = 0; i < repeat; ++i) {
      const uint32_t host = first + i;  // no wrap: past the first host of a group it throws unless first <= hosts <= size
      if (host > hosts) malformed("host ", host, " appears before host ", hosts);
      if (!runs.empty() && runs.back().host == host) malformed("two adjacent runs on host ", host);
      if (host == hosts) ++hosts;
      runs.push_back(HostRun{static_cast<uint32_t>(ranks), run, host});
      ranks += run;
    }
  }
  if (ranks != static_cast<size_t>(size)) malformed("runs of ", ranks, " ranks, not ", size);
  return runs;
}

std::vector<uint32_t> decodeHostTable(const std::string& bytes, int size) {
  std::vector<uint32_t> hostOf;
  hostOf.reserve(static_cast<size_t>(size));
  for (const HostRun& run : decodeHostRuns(bytes, size)) hostOf.insert(hostOf.end(), run.count, run.host);
  return hostOf;
}

}  // namespace kolo::comm::native
