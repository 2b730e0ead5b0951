// Byte sizes, size sweeps and collective names for `kolo bench`.
#include "cli/bench_options.h"

#include <cctype>
#include <cmath>
#include <sstream>

#include "kolo/error.h"

namespace kolo::cli {

size_t parseByteSize(const std::string& text) {
  size_t pos = 0;
  while (pos < text.size() && std::isdigit(static_cast<unsigned char>(text[pos]))) ++pos;
  if (pos == 0) KOLO_THROW(InvalidArgument, "bad byte size '", text, "' (expected e.g. 4096, 4K, 1M, 2G)");
  unsigned long long value = 0;
  try {
    value = std::stoull(text.substr(0, pos));
  } catch (const std::exception&) {
    KOLO_THROW(InvalidArgument, "bad byte size '", text, "' (number out of range)");
  }
  std::string suffix = text.substr(pos);
  for (char& c : suffix) c = static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
  if (suffix.size() >= 2 && suffix.substr(suffix.size() - 2) == "IB") suffix.resize(suffix.size() - 2);
  else if (!suffix.empty() && suffix.back() == 'B') suffix.pop_back();
  unsigned shift = 0;
  if (suffix == "K") shift = 10;
  else if (suffix == "M") shift = 20;
  else if (suffix == "G") shift = 30;
  else if (!suffix.empty()) KOLO_THROW(InvalidArgument, "bad byte size '", text, "' (suffix must be K, M or G)");
  if (shift && value > (~0ULL >> shift)) KOLO_THROW(InvalidArgument, "byte size '", text, "' overflows");
  return static_cast<size_t>(value << shift);
}

std::vector<size_t> sizeSweep(size_t minBytes, size_t maxBytes, double factor, size_t stepBytes) {
  if (minBytes > maxBytes) {
    KOLO_THROW(InvalidArgument, "size sweep: minimum ", minBytes, " bytes exceeds maximum ", maxBytes);
  }
  std::vector<size_t> sizes;
  if (stepBytes == 0 && (factor <= 1.0 || minBytes == 0)) {
    if (minBytes == maxBytes) return {minBytes};
    KOLO_THROW(InvalidArgument, "size sweep from ", minBytes, " to ", maxBytes, " needs a factor above 1 (-f) ",
               "and a minimum above 0, or a step (-i)");
  }
  for (size_t size = minBytes; size <= maxBytes;) {
    sizes.push_back(size);
    const size_t next = stepBytes ? size + stepBytes : static_cast<size_t>(std::llround(size * factor));
    if (next <= size) break;  // overflow or a factor too small to move
    size = next;
  }
  return sizes;
}

std::vector<size_t> parseSizeList(const std::string& text) {
  std::vector<size_t> sizes;
  std::stringstream in(text);
  std::string item;
  while (std::getline(in, item, ',')) {
    if (!item.empty()) sizes.push_back(parseByteSize(item));
  }
  if (sizes.empty()) KOLO_THROW(InvalidArgument, "--sizes '", text, "' lists no size");
  return sizes;
}

const char* benchCollectiveName(BenchCollective collective) {
  switch (collective) {
    case BenchCollective::Allreduce: return "allreduce";
    case BenchCollective::Reduce: return "reduce";
    case BenchCollective::Broadcast: return "broadcast";
    case BenchCollective::Allgather: return "allgather";
    case BenchCollective::ReduceScatter: return "reducescatter";
    case BenchCollective::Alltoall: return "alltoall";
    case BenchCollective::Gather: return "gather";
    case BenchCollective::Scatter: return "scatter";
  }
  return "unknown";
}

BenchCollective parseBenchCollective(const std::string& name) {
  if (name == "allreduce" || name == "all_reduce") return BenchCollective::Allreduce;
  if (name == "reduce") return BenchCollective::Reduce;
  if (name == "broadcast" || name == "bcast") return BenchCollective::Broadcast;
  if (name == "allgather" || name == "all_gather") return BenchCollective::Allgather;
  if (name == "reducescatter" || name == "reduce_scatter" || name == "reduce-scatter")
    return BenchCollective::ReduceScatter;
  if (name == "alltoall" || name == "all_to_all" || name == "all-to-all") return BenchCollective::Alltoall;
  if (name == "gather") return BenchCollective::Gather;
  if (name == "scatter") return BenchCollective::Scatter;
  KOLO_THROW(InvalidArgument, "unknown collective '", name,
             "' (expected allreduce, reduce, broadcast, allgather, reducescatter, alltoall, gather or scatter)");
}

double busBandwidthFactor(BenchCollective collective, int ranks) {
  const double n = ranks;
  switch (collective) {
    case BenchCollective::Allreduce: return 2.0 * (n - 1) / n;
    case BenchCollective::Reduce:
    case BenchCollective::Broadcast: return 1.0;
    case BenchCollective::Allgather:
    case BenchCollective::ReduceScatter:
    case BenchCollective::Alltoall:
    case BenchCollective::Gather:
    case BenchCollective::Scatter: return (n - 1) / n;
  }
  return 1.0;
}

bool splitsAcrossRanks(BenchCollective collective) {
  return collective != BenchCollective::Allreduce && collective != BenchCollective::Reduce &&
         collective != BenchCollective::Broadcast;
}

}  // namespace kolo::cli
