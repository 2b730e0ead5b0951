// What elastic ranks read back from the store that other ranks wrote: a generation's
// membership record and the numbers ranks report under it. Parsed apart from the store so
// that tests and fuzz/elastic_record_fuzz.cc drive the parsers with any bytes.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace kolo::parallel::detail {

/// A generation's record: "STEP TICKETS MEMBER...", TICKETS being the joiner tickets decided.
struct ElasticRecord {
  int64_t step = 0;
  int64_t tickets = 0;
  std::vector<int> members;
};

/// Parses the record stored under `where`. FormatError naming `where` and quoting the text
/// unless it is an int64 step, a count of tickets and distinct non-negative rank ids (int),
/// separated by blanks, with nothing else.
ElasticRecord parseElasticRecord(const std::string& text, const std::string& where);

/// A number a rank stored under `where`: a decimal int64 in [least, most], the whole text.
/// FormatError naming `where` and quoting the text otherwise.
int64_t parseElasticNumber(const std::string& text, const std::string& where, int64_t least,
                           int64_t most);

}  // namespace kolo::parallel::detail
