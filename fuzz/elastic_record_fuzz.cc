// What elastic ranks read from the store that other ranks wrote (src/parallel/elastic/
// record.cc): the first byte picks the text (0: a generation's membership record, 1: a
// rank's reported step, 2: a joiner's id), the rest is the text. A record that parses names
// distinct non-negative ranks and prints back to itself.
#include <algorithm>
#include <climits>
#include <cstddef>
#include <cstdint>
#include <string>

#include "fuzz_check.h"
#include "kolo/error.h"
#include "parallel/elastic/record.h"

using namespace kolo::parallel::detail;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 1) return 0;
  const std::string text(reinterpret_cast<const char*>(data) + 1, size - 1);
  try {
    switch (data[0] % 3) {
      case 0: {
        const ElasticRecord record = parseElasticRecord(text, "g1/members");
        KOLO_FUZZ_REQUIRE(record.tickets >= 0);
        std::string printed = std::to_string(record.step) + " " + std::to_string(record.tickets);
        for (int m : record.members) {
          KOLO_FUZZ_REQUIRE(m >= 0);
          KOLO_FUZZ_REQUIRE(std::count(record.members.begin(), record.members.end(), m) == 1);
          printed += " " + std::to_string(m);
        }
        const ElasticRecord again = parseElasticRecord(printed, "again");
        KOLO_FUZZ_REQUIRE(again.step == record.step && again.tickets == record.tickets &&
                          again.members == record.members);
        break;
      }
      case 1:
        parseElasticNumber(text, "g1/in/0", INT64_MIN, INT64_MAX);
        break;
      default: {
        const int64_t id = parseElasticNumber(text, "joiner/1", 0, INT_MAX);
        KOLO_FUZZ_REQUIRE(id >= 0 && id <= INT_MAX);
      }
    }
  } catch (const kolo::Error&) {
  }
  return 0;
}
