// Slurm's compressed host lists expanded and the store port of a job step derived, for
// detectLaunch under srun and for `kolo run` inside an allocation (kolo/comm/slurm.h).
#include "kolo/comm/slurm.h"

#include <charconv>

#include "kolo/error.h"

namespace kolo::comm {
namespace {

constexpr size_t kMaxHosts = 1000000;

struct ListParser {
  const std::string& variable;
  const std::string& list;

  [[noreturn]] void fail(const std::string& why) const {
    KOLO_THROW(InvalidArgument, variable, "='", list, "' is not a Slurm host list: ", why);
  }

  int64_t number(const std::string& text) const {
    int64_t value = 0;
    auto [ptr, ec] = std::from_chars(text.data(), text.data() + text.size(), value);
    if (text.empty() || ec != std::errc() || ptr != text.data() + text.size())
      fail("'" + text + "' in brackets is not a number");
    return value;
  }

  /// "01-04,07" -> 01 02 03 04 07, each padded to the width of its range's first number.
  std::vector<std::string> group(const std::string& text) const {
    std::vector<std::string> values;
    size_t begin = 0;
    while (begin <= text.size()) {
      size_t end = text.find(',', begin);
      if (end == std::string::npos) end = text.size();
      const std::string item = text.substr(begin, end - begin);
      const size_t dash = item.find('-');
      const std::string low = item.substr(0, dash);
      const std::string high = dash == std::string::npos ? low : item.substr(dash + 1);
      const int64_t from = number(low), to = number(high);
      if (to < from) fail("range " + item + " runs backwards");
      if (static_cast<uint64_t>(to - from) >= kMaxHosts) fail("range " + item + " is too long");
      for (int64_t value = from; value <= to; ++value) {
        std::string digits = std::to_string(value);
        if (digits.size() < low.size()) digits.insert(0, low.size() - digits.size(), '0');
        values.push_back(std::move(digits));
      }
      begin = end + 1;
    }
    return values;
  }

  /// One name with its bracketed groups: every combination, the first group varying slowest.
  std::vector<std::string> name(const std::string& text) const {
    if (text.empty()) fail("it has an empty name");
    std::vector<std::string> hosts{""};
    size_t pos = 0;
    while (pos < text.size()) {
      const size_t open = text.find_first_of("[]", pos);
      if (open == std::string::npos) {
        for (std::string& host : hosts) host += text.substr(pos);
        break;
      }
      if (text[open] == ']') fail("a ']' closes no '['");
      const size_t close = text.find_first_of("[]", open + 1);
      if (close == std::string::npos || text[close] == '[')
        fail(close == std::string::npos ? "a '[' is not closed" : "brackets are nested");
      const std::string prefix = text.substr(pos, open - pos);
      const std::vector<std::string> values = group(text.substr(open + 1, close - open - 1));
      if (hosts.size() * values.size() > kMaxHosts) fail("it names more than a million hosts");
      std::vector<std::string> next;
      next.reserve(hosts.size() * values.size());
      for (const std::string& host : hosts)
        for (const std::string& value : values) next.push_back(host + prefix + value);
      hosts = std::move(next);
      pos = close + 1;
    }
    return hosts;
  }
};

}  // namespace

std::vector<std::string> expandSlurmHostList(const std::string& variable, const std::string& list) {
  const ListParser parser{variable, list};
  if (list.empty()) parser.fail("it is empty");
  // Commas separate names only outside brackets; inside they separate numbers and ranges.
  std::vector<std::string> hosts;
  size_t begin = 0;
  int depth = 0;
  for (size_t pos = 0; pos <= list.size(); ++pos) {
    const char c = pos < list.size() ? list[pos] : ',';
    if (pos == list.size() && depth > 0) parser.fail("a '[' is not closed");
    if (c == '[') ++depth;
    if (c == ']') --depth;
    if (c != ',' || depth > 0) continue;
    for (std::string& host : parser.name(list.substr(begin, pos - begin))) {
      if (hosts.size() >= kMaxHosts) parser.fail("it names more than a million hosts");
      hosts.push_back(std::move(host));
    }
    begin = pos + 1;
  }
  return hosts;
}

int slurmStorePort(int64_t jobId, int64_t stepId) {
  const int64_t step = ((stepId % 100) + 100) % 100;
  const int64_t job = ((jobId % 17000) + 17000) % 17000;
  return static_cast<int>(15000 + (job * 100 + step) % 17000);
}

}  // namespace kolo::comm
