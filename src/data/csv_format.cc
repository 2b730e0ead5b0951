// parseCsv: a CSV/TSV table with a header, parsed in one pass over its bytes, every refused
// row named by file:line and column (no file access and no tensors here: the fuzz harness
// drives it on raw bytes; readCsv maps the file and makes the tensors).
#include <algorithm>
#include <charconv>
#include <cmath>
#include <map>
#include <string_view>

#include "data/csv_format.h"
#include "kolo/data_files.h"
#include "kolo/error.h"

namespace kolo::data {
namespace {

bool endsWith(const std::string& text, const std::string& tail) {
  return text.size() >= tail.size() && text.compare(text.size() - tail.size(), tail.size(), tail) == 0;
}

// Splits lines into fields: one pass over the bytes, quoted fields unescaped into a scratch
// string (the fields of an unquoted line point into the file).
class CsvScanner {
 public:
  CsvScanner(const uint8_t* data, size_t size, char delimiter, const std::string& path)
      : p_(reinterpret_cast<const char*>(data)), end_(p_ + size), delimiter_(delimiter), path_(path) {}

  /// The next non-blank line's fields; false at the end of the file.
  bool next(std::vector<std::string_view>& fields) {
    while (p_ < end_) {
      ++line_;
      fields.clear();
      scratch_.clear();
      scratchStarts_.clear();
      bool quoted = false;
      while (true) {
        const char* fieldStart = p_;
        if (p_ < end_ && *p_ == '"') {
          quoted = true;
          // A quoted field: "" stands for one quote; the delimiter and newlines are text.
          const size_t at = scratch_.size();
          const int64_t openedAt = line_;
          ++p_;
          while (true) {
            if (p_ >= end_) KOLO_THROW(FormatError, path_, ":", openedAt, ": a quoted field has no closing quote");
            if (*p_ == '"') {
              if (p_ + 1 < end_ && p_[1] == '"') {
                scratch_.push_back('"');
                p_ += 2;
                continue;
              }
              ++p_;
              break;
            }
            if (*p_ == '\n') ++line_;
            scratch_.push_back(*p_++);
          }
          scratchStarts_.push_back({fields.size(), at, scratch_.size() - at});
          fields.emplace_back();
          if (p_ < end_ && *p_ != delimiter_ && *p_ != '\n' && *p_ != '\r')
            KOLO_THROW(FormatError, path_, ":", line_, ": text after the closing quote of field ", fields.size());
        } else {
          while (p_ < end_ && *p_ != delimiter_ && *p_ != '\n') ++p_;
          const char* fieldEnd = p_;
          if (fieldEnd > fieldStart && fieldEnd[-1] == '\r' && (p_ == end_ || *p_ == '\n')) --fieldEnd;
          fields.emplace_back(fieldStart, static_cast<size_t>(fieldEnd - fieldStart));
        }
        if (p_ < end_ && *p_ == '\r') ++p_;
        if (p_ >= end_ || *p_ == '\n') {
          if (p_ < end_) ++p_;
          break;
        }
        ++p_;  // the delimiter
      }
      for (const QuotedField& q : scratchStarts_) fields[q.field] = std::string_view(scratch_).substr(q.at, q.length);
      // A blank line (only spaces) separates nothing: skipped.
      if (!quoted && fields.size() == 1 && fields[0].find_first_not_of(" \t") == std::string_view::npos) continue;
      return true;
    }
    return false;
  }
  int64_t line() const { return line_; }

 private:
  struct QuotedField {
    size_t field, at, length;
  };
  const char* p_;
  const char* end_;
  char delimiter_;
  const std::string& path_;
  int64_t line_ = 0;
  std::string scratch_;
  std::vector<QuotedField> scratchStarts_;
};

std::string_view trimmed(std::string_view text) {
  while (!text.empty() && (text.front() == ' ' || text.front() == '\t')) text.remove_prefix(1);
  while (!text.empty() && (text.back() == ' ' || text.back() == '\t')) text.remove_suffix(1);
  return text;
}

std::string shown(std::string_view text) {
  std::string out(text.substr(0, 40));
  if (text.size() > 40) out += "...";
  return out;
}

}  // namespace

CsvColumns parseCsv(const uint8_t* data, size_t size, const std::string& path, const CsvOptions& options) {
  const char delimiter = options.delimiter != 0 ? options.delimiter : (endsWith(path, ".tsv") ? '\t' : ',');
  CsvScanner scanner(data, size, delimiter, path);
  std::vector<std::string_view> fields;
  if (!scanner.next(fields)) KOLO_THROW(FormatError, path, ": empty file (a header line is expected)");
  CsvColumns table;
  int64_t labelColumn = -1;
  std::vector<std::string> header;
  for (size_t i = 0; i < fields.size(); ++i) {
    header.emplace_back(trimmed(fields[i]));
    if (header.back() == options.labelColumn) {
      if (labelColumn >= 0) KOLO_THROW(FormatError, path, ":1: the label column '", options.labelColumn, "' appears twice");
      labelColumn = static_cast<int64_t>(i);
    } else {
      table.featureNames.push_back(header.back());
    }
  }
  if (labelColumn < 0) {
    std::string names;
    for (const std::string& name : header) names += (names.empty() ? "" : ", ") + name;
    KOLO_THROW(FormatError, path, ":", scanner.line(), ": no column named '", options.labelColumn,
               "' for the labels; the header holds: ", names);
  }
  const size_t columns = header.size();
  const size_t features = columns - 1;
  KOLO_REQUIRE(features > 0, path, ": the header names only the label column '", options.labelColumn,
               "', no feature");
  // One pass: features parsed straight into the values; labels kept as text until every row
  // says whether they are all integers.
  std::vector<float>& values = table.values;
  values.reserve(std::min<size_t>(size / 2, size_t(1) << 26));
  std::vector<std::string> labelTexts;
  std::vector<int64_t> labelLines;
  std::vector<int64_t> integerLabels;
  bool integers = options.classNames.empty();
  while (scanner.next(fields)) {
    if (fields.size() != columns)
      KOLO_THROW(FormatError, path, ":", scanner.line(), ": ", fields.size(), " fields, the header has ", columns);
    for (size_t c = 0; c < columns; ++c) {
      const std::string_view field = trimmed(fields[c]);
      if (static_cast<int64_t>(c) == labelColumn) {
        if (field.empty()) KOLO_THROW(FormatError, path, ":", scanner.line(), ": the label ('", options.labelColumn, "') is missing");
        if (integers) {
          int64_t label = 0;
          const auto [end, ec] = std::from_chars(field.data(), field.data() + field.size(), label);
          if (ec == std::errc() && end == field.data() + field.size() && label >= 0) {
            integerLabels.push_back(label);
          } else {
            integers = false;
          }
        }
        labelTexts.emplace_back(field);
        labelLines.push_back(scanner.line());
        continue;
      }
      if (field.empty())
        KOLO_THROW(FormatError, path, ":", scanner.line(), ": column '", header[c], "' is missing a value");
      float value = 0.0f;
      const char* first = field.data() + (field.front() == '+' ? 1 : 0);
      const auto [end, ec] = std::from_chars(first, field.data() + field.size(), value);
      if (ec != std::errc() || end != field.data() + field.size() || !std::isfinite(value)) {
        if (ec == std::errc::result_out_of_range)
          KOLO_THROW(FormatError, path, ":", scanner.line(), ": column '", header[c], "': '", shown(field),
                     "' is out of the range of a 32-bit float");
        KOLO_THROW(FormatError, path, ":", scanner.line(), ": column '", header[c], "': '", shown(field),
                   "' is not a finite number");
      }
      values.push_back(value);
    }
  }
  const int64_t rows = static_cast<int64_t>(labelTexts.size());
  if (rows == 0) KOLO_THROW(FormatError, path, ": the header is followed by no row");
  table.rows = rows;
  table.features = static_cast<int64_t>(features);
  std::vector<int64_t>& labels = table.labels;
  labels.resize(static_cast<size_t>(rows));
  if (integers) {
    labels = std::move(integerLabels);
    table.classes = *std::max_element(labels.begin(), labels.end()) + 1;
  } else {
    table.classNames = options.classNames;
    if (table.classNames.empty()) {
      table.classNames = labelTexts;
      std::sort(table.classNames.begin(), table.classNames.end());
      table.classNames.erase(std::unique(table.classNames.begin(), table.classNames.end()), table.classNames.end());
    }
    std::map<std::string_view, int64_t> classOf;
    for (size_t i = 0; i < table.classNames.size(); ++i) classOf[table.classNames[i]] = static_cast<int64_t>(i);
    for (int64_t r = 0; r < rows; ++r) {
      const auto found = classOf.find(labelTexts[static_cast<size_t>(r)]);
      if (found == classOf.end())
        KOLO_THROW(FormatError, path, ":", labelLines[static_cast<size_t>(r)], ": label '",
                   shown(labelTexts[static_cast<size_t>(r)]), "' is not one of the ", table.classNames.size(),
                   " classes of the training data");
      labels[static_cast<size_t>(r)] = found->second;
    }
    table.classes = static_cast<int64_t>(table.classNames.size());
  }
  return table;
}

}  // namespace kolo::data
