// The hang diagnosis: the dumps of every rank are lined up per communicator by sequence
// number. The first collective that some rank has not finished is where the job stands;
// the ranks with an entry for it are in it, the others never entered it (their own last
// entries say what they did instead), and entries of one sequence number with different
// signatures are a mismatch.
#include <algorithm>
#include <climits>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <map>
#include <optional>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>

#include "kolo/error.h"
#include "kolo/hang_report.h"
#include "observe/rank_files.h"

namespace kolo::observe {
namespace {

/// The most ranks a dump may speak of: the diagnosis lists ranks one by one.
constexpr int64_t kMaxDumpRanks = 1 << 16;
/// Clock readings are non-negative and below this, so that their differences fit.
constexpr int64_t kMaxDumpNs = INT64_MAX / 2;

/// Field `key` of dump object `j`, an integer within [least, most]; `fallback` when it is
/// absent (none: the field is required). FormatError naming the field otherwise: the dump is
/// read from a file, and a value out of range would be cast or looped over.
int64_t integer(const nlohmann::json& j, const char* key, int64_t least, int64_t most,
                std::optional<int64_t> fallback = std::nullopt) {
  const auto it = j.find(key);
  if (it == j.end()) {
    if (fallback) return *fallback;
    KOLO_THROW(FormatError, "no \"", key, "\"");
  }
  const bool fits = it->is_number_integer() &&
                    !(it->is_number_unsigned() && it->get<uint64_t>() > static_cast<uint64_t>(INT64_MAX)) &&
                    it->get<int64_t>() >= least && it->get<int64_t>() <= most;
  if (!fits) KOLO_THROW(FormatError, "\"", key, "\" is ", it->dump(), ", not an integer in ", least, "..", most);
  return it->get<int64_t>();
}

std::string seconds(int64_t ns) {
  std::ostringstream out;
  out.setf(std::ios::fixed);
  out.precision(1);
  out << static_cast<double>(ns) / 1e9 << " s";
  return out.str();
}

std::string joinRanks(const std::vector<int>& ranks) {
  std::ostringstream out;
  out << (ranks.size() == 1 ? "rank " : "ranks ");
  for (size_t i = 0; i < ranks.size(); ++i) {
    if (i) out << (i + 1 == ranks.size() ? " and " : ", ");
    out << ranks[i];
  }
  return out.str();
}

// "allreduce #5 (f32 sum count=1000)" or "send to rank 2 (f32 count=10)".
std::string describe(const FlightEntry& e) {
  std::ostringstream out;
  out << e.op;
  if (e.seq >= 0) out << " #" << e.seq;
  if (e.peer >= 0) out << (e.op == "recv" || e.op == "irecv" ? " from rank " : " to rank ") << e.peer;
  const std::string sig = e.signature();
  const size_t space = sig.find(' ');
  if (space != std::string::npos) out << " (" << sig.substr(space + 1) << ")";
  return out.str();
}

// How long before the dump the entry began, and its state.
std::string stateOf(const FlightEntry& e, const FlightDump& d) {
  std::ostringstream out;
  if (e.state == "done") {
    out << "done " << seconds(d.dumpNs - e.finishedNs) << " before the dump";
  } else if (e.state == "started") {
    out << "started " << seconds(d.dumpNs - e.startedNs) << " before the dump, still waiting";
  } else if (e.state == "queued") {
    out << "queued " << seconds(d.dumpNs - e.queuedNs) << " before the dump, not started";
  } else if (e.state == "failed") {
    out << "failed: " << e.error;
  } else {
    out << e.state;
  }
  return out.str();
}

bool stopped(const FlightDump& d) { return d.note.find("stopped") != std::string::npos; }

// The part of a note that says how the process is stopped ("the process is stopped (state
// T: ...)"), or the whole note.
std::string stoppedHow(const FlightDump& d) {
  size_t begin = 0;
  while (begin <= d.note.size()) {
    size_t end = d.note.find("; ", begin);
    if (end == std::string::npos) end = d.note.size();
    const std::string part = d.note.substr(begin, end - begin);
    if (part.find("stopped") != std::string::npos) return part;
    begin = end + 2;
  }
  return d.note;
}

// "ns::f(int) [clone .cold] (lib.so)" -> "ns::f [clone .cold]"; "sleep@GLIBC_2.2.5 (libc.so.6)" -> "sleep".
std::string shortFrame(std::string frame) {
  if (frame.size() > 1 && frame.back() == ')') {  // the module
    const size_t open = frame.rfind(" (");
    if (open != std::string::npos) frame.erase(open);
  }
  const size_t at = frame.find('@');
  if (at != std::string::npos) frame.erase(at);
  // The argument list: the last balanced "(...)" that is not "(anonymous namespace)".
  std::string suffix;
  const size_t clone = frame.find(" [clone");
  if (clone != std::string::npos) {
    suffix = frame.substr(clone);
    frame.erase(clone);
  }
  while (!frame.empty() && frame.back() == ' ') frame.pop_back();
  if (!frame.empty() && frame.back() == ')') {
    int depth = 0;
    for (size_t i = frame.size(); i-- > 0;) {
      if (frame[i] == ')') ++depth;
      if (frame[i] == '(' && --depth == 0) {
        if (frame.compare(i, 21, "(anonymous namespace)") != 0) frame.erase(i);
        break;
      }
    }
  }
  return frame + suffix;
}

// The main thread's stack of a dump (tid == pid), or the first answered one.
const DumpedStack* mainStack(const FlightDump& d) {
  for (const DumpedStack& s : d.stacks)
    if (s.tid == d.pid && s.answered) return &s;
  return nullptr;
}

}  // namespace

std::string shortStack(const DumpedStack& stack, size_t frames) {
  std::string out;
  for (size_t i = 0; i < stack.frames.size() && i < frames; ++i) {
    if (i) out += " < ";
    out += shortFrame(stack.frames[i]);
  }
  if (stack.frames.size() > frames) out += " < ...";
  return out;
}

std::string FlightEntry::signature() const {
  std::ostringstream out;
  out << op;
  if (op == "barrier") return out.str();
  out << " " << dtype;
  if (!reduce.empty()) out << " " << reduce;
  out << " count=" << count;
  if (root >= 0) out << " root=" << root;
  if (!algorithm.empty() && algorithm != "auto") out << " " << algorithm;
  return out.str();
}

std::vector<FlightDump> loadFlightDumps(const std::string& dir) {
  namespace fs = std::filesystem;
  std::error_code ec;
  if (!fs::is_directory(dir, ec)) KOLO_THROW(FileError, "debug directory ", dir, " does not exist");
  std::vector<FlightDump> dumps;
  for (const auto& file : fs::directory_iterator(dir, ec)) {
    const std::string base = file.path().filename().string();
    if (!detail::rankOfFile(base, "flight.rank", ".json")) continue;
    std::ifstream in(file.path());
    const nlohmann::json j = nlohmann::json::parse(in, nullptr, false);
    if (j.is_discarded() || !j.is_object() || !j.contains("entries") || !j["entries"].is_array())
      KOLO_THROW(FormatError, file.path().string(), " is not a flight-recorder dump (a JSON object with entries)");
    try {
      FlightDump d;
      d.path = file.path().string();
      d.worldSize = static_cast<int>(integer(j, "world_size", 1, kMaxDumpRanks));
      d.rank = static_cast<int>(integer(j, "rank", 0, d.worldSize - 1));
      d.pid = integer(j, "pid", 0, INT64_MAX, 0);
      d.reason = j.value("reason", "");
      d.note = j.value("note", "");
      d.dumpNs = integer(j, "dump_ns", 0, kMaxDumpNs);
      for (const auto& x : j["entries"]) {
        FlightEntry e;
        e.id = static_cast<uint64_t>(integer(x, "id", 0, INT64_MAX));
        e.seq = integer(x, "seq", INT64_MIN, INT64_MAX);
        e.context = static_cast<uint32_t>(integer(x, "context", 0, UINT32_MAX));
        e.groupSize = static_cast<int>(integer(x, "group_size", 1, kMaxDumpRanks));
        e.groupRank = static_cast<int>(integer(x, "group_rank", 0, e.groupSize - 1));
        e.op = x.at("op").get<std::string>();
        e.dtype = x.value("dtype", "");
        e.reduce = x.value("reduce", "");
        e.algorithm = x.value("algorithm", "");
        e.state = x.at("state").get<std::string>();
        e.error = x.value("error", "");
        e.count = integer(x, "count", INT64_MIN, INT64_MAX, 0);
        e.bytes = integer(x, "bytes", INT64_MIN, INT64_MAX, 0);
        e.root = static_cast<int>(integer(x, "root", -1, kMaxDumpRanks, -1));
        e.peer = static_cast<int>(integer(x, "peer", -1, kMaxDumpRanks, -1));
        e.queuedNs = integer(x, "queued_ns", 0, kMaxDumpNs, 0);
        e.startedNs = integer(x, "started_ns", 0, kMaxDumpNs, 0);
        e.finishedNs = integer(x, "finished_ns", 0, kMaxDumpNs, 0);
        d.entries.push_back(std::move(e));
      }
      if (j.contains("stacks") && j["stacks"].is_array()) {
        for (const auto& x : j["stacks"]) {
          DumpedStack stack;
          stack.tid = static_cast<int>(integer(x, "tid", INT_MIN, INT_MAX, 0));
          stack.name = x.value("name", "");
          stack.answered = x.value("answered", false);
          if (x.contains("frames") && x["frames"].is_array())
            for (const auto& frame : x["frames"]) stack.frames.push_back(frame.get<std::string>());
          d.stacks.push_back(std::move(stack));
        }
      }
      std::sort(d.entries.begin(), d.entries.end(),
                [](const FlightEntry& a, const FlightEntry& b) { return a.id < b.id; });
      dumps.push_back(std::move(d));
    } catch (const nlohmann::json::exception& e) {
      KOLO_THROW(FormatError, file.path().string(), " is not a flight-recorder dump: ", e.what());
    } catch (const FormatError& e) {
      KOLO_THROW(FormatError, file.path().string(), " is not a flight-recorder dump: ", e.what());
    }
  }
  if (dumps.empty()) KOLO_THROW(FileError, "debug directory ", dir, " holds no flight.rank<R>.json dump");
  std::sort(dumps.begin(), dumps.end(), [](const FlightDump& a, const FlightDump& b) { return a.rank < b.rank; });
  return dumps;
}

std::vector<std::string> diagnoseHang(const std::vector<FlightDump>& dumps, int worldSize) {
  std::vector<std::string> lines;
  std::vector<std::string> verdicts;
  int world = worldSize;
  for (const FlightDump& d : dumps) world = std::max(world, d.worldSize);
  std::map<int, const FlightDump*> byRank;
  for (const FlightDump& d : dumps) byRank[d.rank] = &d;
  {
    std::ostringstream out;
    out << "flight recorders of " << dumps.size() << " of " << world << " ranks:";
    for (const FlightDump& d : dumps) {
      out << " rank " << d.rank << " (" << d.reason << ")";
      if (&d != &dumps.back()) out << ",";
    }
    lines.push_back(out.str());
    std::vector<int> silent;
    for (int r = 0; r < world; ++r)
      if (!byRank.count(r)) silent.push_back(r);
    if (!silent.empty()) lines.push_back("no flight recorder from " + joinRanks(silent));
    for (const FlightDump& d : dumps)
      if (!d.note.empty()) lines.push_back("rank " + std::to_string(d.rank) + ": " + d.note);
  }

  std::set<uint32_t> contexts;
  for (const FlightDump& d : dumps)
    for (const FlightEntry& e : d.entries)
      if (e.seq >= 0) contexts.insert(e.context);

  for (const uint32_t context : contexts) {
    // Per rank: its collectives on this communicator by sequence number (the latest entry).
    std::map<int, std::map<int64_t, const FlightEntry*>> bySeq;
    int groupSize = 1;
    for (const FlightDump& d : dumps)
      for (const FlightEntry& e : d.entries)
        if (e.seq >= 0 && e.context == context) {
          bySeq[d.rank][e.seq] = &e;
          groupSize = e.groupSize;
        }
    int64_t stuck = -1;
    for (const auto& [rank, entries] : bySeq)
      for (const auto& [seq, e] : entries)
        if (e->state != "done" && (stuck < 0 || seq < stuck)) {
          stuck = seq;
          break;
        }
    if (stuck < 0) continue;  // every collective this communicator began has finished

    const bool isWorld = context == 1;
    std::vector<int> in, missing;
    std::map<std::string, std::vector<int>> bySignature;
    const FlightEntry* sample = nullptr;
    std::set<int> presentGroupRanks;
    for (const auto& [rank, entries] : bySeq) {
      auto it = entries.find(stuck);
      if (it == entries.end()) continue;
      in.push_back(rank);
      bySignature[it->second->signature()].push_back(rank);
      presentGroupRanks.insert(it->second->groupRank);
      if (!sample || bySignature[it->second->signature()].size() > bySignature[sample->signature()].size())
        sample = it->second;
    }
    std::ostringstream head;
    head << (isWorld ? "the world communicator (" : "communicator " + std::to_string(context) + " (")
         << groupSize << " ranks): collective " << describe(*sample) << " is not complete";
    lines.push_back(head.str());
    for (int rank : in) {
      const FlightDump& d = *byRank[rank];
      const FlightEntry& e = *bySeq[rank][stuck];
      std::string line = "  rank " + std::to_string(rank) + ": in it";
      if (!isWorld) line += " (group rank " + std::to_string(e.groupRank) + ")";
      if (bySignature.size() > 1) line += " as " + e.signature();
      line += ", " + stateOf(e, d);
      if (stopped(d)) line += " [" + d.note + "]";
      lines.push_back(line);
      if (stopped(d))
        verdicts.push_back("=> rank " + std::to_string(rank) + " is inside " + describe(e) + " but " +
                           stoppedHow(d) + "; the others wait for it");
    }

    // Members that never entered it: on the world, every rank; on a sub-communicator, the
    // group ranks with no entry (their global ranks are known only when they dumped).
    std::vector<int> candidates;
    if (isWorld) {
      for (int r = 0; r < world; ++r)
        if (std::find(in.begin(), in.end(), r) == in.end()) candidates.push_back(r);
    } else {
      for (const auto& [rank, entries] : bySeq)
        if (std::find(in.begin(), in.end(), rank) == in.end()) candidates.push_back(rank);
      std::vector<int> absent;
      for (int g = 0; g < groupSize; ++g) {
        bool known = presentGroupRanks.count(g) > 0;
        for (int rank : candidates)
          known = known || (!bySeq[rank].empty() && bySeq[rank].begin()->second->groupRank == g);
        if (!known) absent.push_back(g);
      }
      if (!absent.empty()) {
        std::ostringstream out;
        out << "  group rank(s)";
        for (int g : absent) out << " " << g;
        out << ": no entry for this communicator in any dump";
        lines.push_back(out.str());
      }
    }
    for (int rank : candidates) {
      auto dumpIt = byRank.find(rank);
      if (dumpIt == byRank.end()) {
        lines.push_back("  rank " + std::to_string(rank) + ": never entered it as far as is known (no dump)");
        missing.push_back(rank);
        continue;
      }
      const FlightDump& d = *dumpIt->second;
      const auto& entries = bySeq[rank];
      std::string line = "  rank " + std::to_string(rank) + ": ";
      const FlightEntry* last = entries.empty() ? nullptr : std::prev(entries.end())->second;
      if (last && last->seq > stuck) {
        line += "has no entry for it although it went on to " + describe(*last) +
                " (its ring no longer holds #" + std::to_string(stuck) + ")";
        lines.push_back(line);
        continue;
      }
      missing.push_back(rank);
      line += "never entered it; ";
      if (last) {
        line += "its last collective here is " + describe(*last) + ", " + stateOf(*last, d);
      } else {
        line += "it issued no collective on this communicator";
      }
      // What it did instead: its own later entries (point to point, other communicators).
      std::vector<std::string> after;
      for (const FlightEntry& e : d.entries)
        if ((!last || e.id > last->id) && !(e.seq >= 0 && e.context == context))
          after.push_back(describe(e) + " (" + e.state + ")");
      if (after.empty()) {
        line += "; it recorded nothing since";
      } else {
        line += "; since then:";
        const size_t from = after.size() > 3 ? after.size() - 3 : 0;
        for (size_t i = from; i < after.size(); ++i) line += (i == from ? " " : ", ") + after[i];
      }
      if (!d.note.empty()) line += " [" + d.note + "]";
      lines.push_back(line);
      // What it was doing instead, from its own stack.
      if (const DumpedStack* stack = mainStack(d))
        lines.push_back("    its main thread (tid " + std::to_string(stack->tid) + ") was in: " + shortStack(*stack));
    }

    if (bySignature.size() > 1) {
      // The pair: one rank of the largest group and one of the smallest.
      auto largest = bySignature.begin(), smallest = bySignature.begin();
      for (auto it = bySignature.begin(); it != bySignature.end(); ++it) {
        if (it->second.size() > largest->second.size()) largest = it;
        if (it->second.size() < smallest->second.size() ||
            (it->second.size() == smallest->second.size() && smallest == largest))
          smallest = it;
      }
      if (smallest == largest) smallest = std::next(largest) == bySignature.end() ? bySignature.begin() : std::next(largest);
      const int a = std::min(largest->second.front(), smallest->second.front());
      const int b = std::max(largest->second.front(), smallest->second.front());
      const std::string& sigA = a == largest->second.front() ? largest->first : smallest->first;
      const std::string& sigB = a == largest->second.front() ? smallest->first : largest->first;
      verdicts.push_back("=> signatures disagree at collective #" + std::to_string(stuck) + ": rank " +
                         std::to_string(a) + " calls " + sigA + " but rank " + std::to_string(b) + " calls " +
                         sigB + " (the mismatching pair: rank " + std::to_string(a) + " and rank " +
                         std::to_string(b) + ")");
    }
    for (int rank : missing) {
      auto dumpIt = byRank.find(rank);
      const bool isStopped = dumpIt != byRank.end() && stopped(*dumpIt->second);
      std::vector<int> waiting;
      for (int r : in) waiting.push_back(r);
      std::string verdict = "=> rank " + std::to_string(rank) + " never entered " + describe(*sample);
      if (isStopped) verdict += ": " + stoppedHow(*dumpIt->second);
      if (!waiting.empty()) verdict += "; " + joinRanks(waiting) + (waiting.size() == 1 ? " waits" : " wait") + " for it";
      verdicts.push_back(verdict);
    }
    if (missing.empty() && bySignature.size() == 1 && verdicts.empty())
      verdicts.push_back("=> every rank entered " + describe(*sample) +
                         " and none finished it: a rank too slow, or a lost connection (see the errors above)");
  }
  if (contexts.empty() || (lines.size() > 0 && verdicts.empty() && contexts.size() > 0)) {
    bool anyPending = false;
    for (const FlightDump& d : dumps)
      for (const FlightEntry& e : d.entries) anyPending = anyPending || e.state != "done";
    if (!anyPending) verdicts.push_back("=> no collective is pending: every rank finished every collective it began");
  }
  for (std::string& verdict : verdicts) lines.push_back(std::move(verdict));
  return lines;
}

}  // namespace kolo::observe
