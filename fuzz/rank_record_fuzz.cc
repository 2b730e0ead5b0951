// The native backend's rendezvous records as a rank reads them from the store: the first
// byte picks the record (even: a rank's record; 1 mod 4: the host segment record; 3 mod 4:
// the host table, whose rank count is the next byte plus one), the rest is its text. A
// record that decodes is within the bounds the rendezvous relies on (cpu ids size a table,
// addresses are dialled, host indices index hosts) and encodes back to itself.
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "comm/native/rank_record.h"
#include "fuzz_check.h"
#include "kolo/error.h"

using namespace kolo::comm::native;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 1) return 0;
  const std::string text(reinterpret_cast<const char*>(data) + 1, size - 1);
  try {
    if (data[0] % 2 == 0) {
      const RankRecord record = decodeRankRecord(text, 3);
      KOLO_FUZZ_REQUIRE(record.pid >= 1 && record.port >= 1 && record.port <= 65535);
      KOLO_FUZZ_REQUIRE(!record.hostId.empty() && record.hostId.size() <= kMaxHostIdBytes);
      KOLO_FUZZ_REQUIRE(record.cpus.size() <= kMaxRecordCpus);
      for (int c : record.cpus) KOLO_FUZZ_REQUIRE(c >= 0 && c < kMaxCpuId);
      KOLO_FUZZ_REQUIRE(!record.addresses.empty() && record.addresses.size() <= kMaxRecordAddresses);
      for (const auto& a : record.addresses) KOLO_FUZZ_REQUIRE(!a.empty() && a.size() <= kMaxAddressBytes);
      KOLO_FUZZ_REQUIRE(decodeRankRecord(encodeRankRecord(record), 3) == record);
    } else if (data[0] % 4 == 3) {
      if (text.empty()) return 0;
      const int ranks = 1 + static_cast<uint8_t>(text[0]);
      const std::string table = text.substr(1);
      const std::vector<uint32_t> hostOf = decodeHostTable(table, ranks);
      KOLO_FUZZ_REQUIRE(hostOf.size() == static_cast<size_t>(ranks));
      uint32_t hosts = 0;
      for (uint32_t h : hostOf) {
        KOLO_FUZZ_REQUIRE(h <= hosts);
        if (h == hosts) ++hosts;
      }
      KOLO_FUZZ_REQUIRE(encodeHostTable(hostOf) == table);
    } else {
      const HostSegmentRecord record = decodeHostSegmentRecord(text, 3);
      KOLO_FUZZ_REQUIRE(!record.error.empty() || (record.pid >= 1 && record.fd >= 0));
      KOLO_FUZZ_REQUIRE(decodeHostSegmentRecord(encodeHostSegmentRecord(record), 3) == record);
    }
  } catch (const kolo::Error&) {
  }
  return 0;
}
