// parseCsv: a CSV/TSV table's values from bytes in memory, before they become tensors
// (readCsv); in a header of its own so that the fuzz harness reaches it without files or
// tensors.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "kolo/data_files.h"

namespace kolo::data {

/// A table as parseCsv reads it: `rows` x `features` values row by row, and the labels.
struct CsvColumns {
  std::vector<float> values;
  std::vector<int64_t> labels;
  int64_t rows = 0, features = 0;
  std::vector<std::string> featureNames, classNames;
  int64_t classes = 0;
};

/// Parses the CSV/TSV bytes [data, data + size) as readCsv does (`path` names them in
/// messages and picks the delimiter); throws what readCsv throws for their contents.
CsvColumns parseCsv(const uint8_t* data, size_t size, const std::string& path, const CsvOptions& options);

}  // namespace kolo::data
