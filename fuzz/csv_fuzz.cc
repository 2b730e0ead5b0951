// CSV/TSV tables. A table that parses holds rows x features finite values, one label per row
// below its class count; errors are kolo::Errors.
#include <cmath>
#include <cstddef>
#include <cstdint>

#include "data/csv_format.h"
#include "fuzz_check.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  // The first byte picks the file's name (delimiter) and a label column.
  if (size < 1) return 0;
  const std::string path = data[0] & 1 ? "fuzz.tsv" : "fuzz.csv";
  kolo::data::CsvOptions options;
  options.labelColumn = data[0] & 2 ? "y" : "label";
  if (data[0] & 4) options.classNames = {"a", "b", "c"};
  try {
    const kolo::data::CsvColumns table = kolo::data::parseCsv(data + 1, size - 1, path, options);
    KOLO_FUZZ_REQUIRE(table.rows > 0 && table.features > 0);
    KOLO_FUZZ_REQUIRE(table.values.size() == size_t(table.rows * table.features));
    KOLO_FUZZ_REQUIRE(table.labels.size() == size_t(table.rows));
    KOLO_FUZZ_REQUIRE(table.featureNames.size() == size_t(table.features));
    for (const float v : table.values) KOLO_FUZZ_REQUIRE(std::isfinite(v));
    for (const int64_t label : table.labels) KOLO_FUZZ_REQUIRE(label >= 0 && label < table.classes);
  } catch (const kolo::Error&) {
  }
  return 0;
}
