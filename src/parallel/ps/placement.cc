// Placement of parameters over the servers: big tensors are split evenly (each server takes a
// contiguous range), the rest go whole to the least loaded server, largest first, so that
// the bytes every server receives and sends per step are as even as the sizes allow.
#include <algorithm>
#include <numeric>

#include "kolo/error.h"
#include "kolo/parallel/parameter_server.h"

namespace kolo::parallel::ps {

const char* modeName(Mode mode) {
  switch (mode) {
    case Mode::Sync:
      return "sync";
    case Mode::Async:
      return "async";
    case Mode::Ssp:
      return "ssp";
  }
  return "?";
}

Mode parseMode(const std::string& name) {
  if (name == "sync") return Mode::Sync;
  if (name == "async") return Mode::Async;
  if (name == "ssp") return Mode::Ssp;
  KOLO_THROW(InvalidArgument, "parseMode '", name, "' is not accepted: use sync, async or ssp");
}

Compression parseCompression(const std::string& name) {
  if (name == "none") return Compression::None;
  if (name == "bf16") return Compression::Bf16;
  if (name == "fp16") return Compression::Fp16;
  KOLO_THROW(InvalidArgument, "parseCompression '", name,
             "' is not accepted: use none, bf16 or fp16");
}

std::vector<Slice> Placement::slicesOf(int server) const {
  std::vector<Slice> mine;
  for (const Slice& s : slices)
    if (s.server == server) mine.push_back(s);
  return mine;
}

int64_t Placement::elementsOf(int server) const {
  int64_t total = 0;
  for (const Slice& s : slices)
    if (s.server == server) total += s.size();
  return total;
}

Placement placeParameters(const std::vector<std::string>& names, const std::vector<int64_t>& sizes,
                          int servers, int64_t shardBytes) {
  KOLO_REQUIRE(servers >= 1, "a parameter-server job needs at least 1 server, got ", servers);
  KOLO_REQUIRE(shardBytes >= 1, "ParameterServerOptions::shardBytes must be at least 1, got ", shardBytes);
  KOLO_CHECK_EQ(names.size(), sizes.size());
  Placement placement;
  placement.servers = servers;
  placement.names = names;
  placement.sizes = sizes;
  std::vector<int64_t> load(static_cast<size_t>(servers), 0);
  std::vector<Slice> slices;
  std::vector<int> whole;
  for (size_t p = 0; p < sizes.size(); ++p) {
    const int64_t n = sizes[p];
    if (servers > 1 && n * 4 > shardBytes && n >= servers) {
      for (int s = 0; s < servers; ++s) {
        const Slice slice{static_cast<int>(p), n * s / servers, n * (s + 1) / servers, s};
        load[static_cast<size_t>(s)] += slice.size() * 4;
        slices.push_back(slice);
      }
    } else {
      whole.push_back(static_cast<int>(p));
    }
  }
  // Largest first onto the least loaded server; the stable sort keeps model order for ties.
  std::stable_sort(whole.begin(), whole.end(), [&](int a, int b) {
    return sizes[static_cast<size_t>(a)] > sizes[static_cast<size_t>(b)];
  });
  for (int p : whole) {
    const auto least = std::min_element(load.begin(), load.end());
    const int server = static_cast<int>(least - load.begin());
    *least += sizes[static_cast<size_t>(p)] * 4;
    slices.push_back({p, 0, sizes[static_cast<size_t>(p)], server});
  }
  std::sort(slices.begin(), slices.end(), [](const Slice& a, const Slice& b) {
    if (a.server != b.server) return a.server < b.server;
    if (a.parameter != b.parameter) return a.parameter < b.parameter;
    return a.begin < b.begin;
  });
  placement.slices = std::move(slices);
  return placement;
}

Placement placeParameters(const NamedTensors& parameters, int servers, int64_t shardBytes) {
  std::vector<std::string> names;
  std::vector<int64_t> sizes;
  for (const auto& [name, tensor] : parameters) {
    names.push_back(name);
    sizes.push_back(tensor.numel());
  }
  return placeParameters(names, sizes, servers, shardBytes);
}

}  // namespace kolo::parallel::ps
