// The records the native backend's rendezvous exchanges through the store: one per rank
// (who and where it is), one per host (the shared-memory segment its lowest rank made) and
// the job's host table (which host every rank is on, in runs of consecutive ranks).
// Any store client can write these keys, so decoding treats them as untrusted bytes.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace kolo::comm::native {

/// Bounds a decoded rank record stays within; anything beyond them is a FormatError.
inline constexpr size_t kMaxRecordBytes = size_t{1} << 18;
inline constexpr size_t kMaxHostIdBytes = 4096;
inline constexpr size_t kMaxRecordAddresses = 256;
inline constexpr size_t kMaxAddressBytes = 255;
inline constexpr size_t kMaxRecordCpus = 8192;
/// CPU ids are below this (Linux allows at most 8192 CPUs; the rendezvous sizes a
/// per-host table by the largest id).
inline constexpr int kMaxCpuId = 1 << 16;

/// What a rank publishes at rendezvous.
struct RankRecord {
  /// Ranks with equal host ids share memory (hostname, boot id, network namespace).
  std::string hostId;
  int pid = 0;
  /// The port the rank accepts peers' TCP connections on, 1..65535.
  int port = 0;
  /// Where to reach the rank, most preferred first; at least one.
  std::vector<std::string> addresses;
  /// A word in the rank's memory and its value, for peers to test cross-memory attach.
  uint64_t probeAddress = 0;
  uint64_t probeValue = 0;
  /// CPUs the rank may run on (its affinity mask when it published the record).
  std::vector<int> cpus;

  bool operator==(const RankRecord&) const = default;
};

/// The text form: host id, pid, port, probe address, probe value, comma-separated cpus,
/// one line each, then one line per address. Throws InvalidArgument for a record that
/// decodeRankRecord would refuse.
std::string encodeRankRecord(const RankRecord& record);

/// Parses the record `rank` published. Throws FormatError naming the rank for anything
/// encodeRankRecord cannot produce: missing or non-numeric fields, a pid below 1, a port
/// outside 1..65535, cpu ids outside [0, kMaxCpuId), more than kMaxRecordCpus cpus or
/// kMaxRecordAddresses addresses, no address, oversized fields.
RankRecord decodeRankRecord(const std::string& text, int rank);

/// The host segment record: "<pid> <fd>" of the rank that created the segment (peers open
/// it as /proc/<pid>/fd/<fd>), or "error <message>" when it could not.
struct HostSegmentRecord {
  int pid = 0;
  int fd = -1;
  /// Non-empty: why the creator failed; pid and fd are then unset.
  std::string error;

  bool operator==(const HostSegmentRecord&) const = default;
};

/// Throws InvalidArgument for a record decodeHostSegmentRecord would refuse.
std::string encodeHostSegmentRecord(const HostSegmentRecord& record);

/// Parses the host segment record read by `rank`. Throws FormatError naming the rank for
/// anything else than "<pid> <fd>" with pid >= 1 and fd >= 0 in decimal, or "error "
/// followed by a non-empty message.
HostSegmentRecord decodeHostSegmentRecord(const std::string& text, int rank);

/// The host of every rank as indices 0, 1, ... in order of each host's lowest rank, kept as
/// runs of consecutive ranks on one host, and runs of one length on consecutive hosts as one
/// group: triples of little-endian uint32 (ranks in each run, the first run's host, runs in
/// the group). A job whose hosts hold as many consecutive ranks each (as `kolo run`, Slurm
/// and mpirun's block placement give them) is one group: 12 bytes, whatever its size.
std::string encodeHostTable(const std::vector<uint32_t>& hostOf);

/// A run of consecutive ranks on one host: ranks first .. first + count - 1.
struct HostRun {
  uint32_t first = 0;
  uint32_t count = 0;
  uint32_t host = 0;

  bool operator==(const HostRun&) const = default;
};

/// The runs of a host table for `size` ranks, in rank order, with decodeHostTable's checks.
std::vector<HostRun> decodeHostRuns(const std::string& bytes, int size);

/// Parses a host table for `size` ranks. Throws FormatError for anything encodeHostTable
/// cannot produce: a length that is not whole triples, an empty run or group, runs that do
/// not add up to `size`, two adjacent runs on one host, a group that should have been part
/// of the one before it, or a host index that is not the next new one where a host first
/// appears.
std::vector<uint32_t> decodeHostTable(const std::string& bytes, int size);

}  // namespace kolo::comm::native
