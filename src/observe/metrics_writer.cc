// MetricsWriter: JSON-lines metrics, one flushed object per line.
#include <cerrno>
#include <cstring>

#include "kolo/error.h"
#include "kolo/observe.h"

namespace kolo::observe {

MetricsWriter::MetricsWriter(const std::string& path, bool append) : path_(path) {
  file_ = std::fopen(path.c_str(), append ? "a" : "w");
  if (!file_) KOLO_THROW(IoError, "cannot open metrics file ", path, ": ", std::strerror(errno));
}

MetricsWriter::~MetricsWriter() {
  if (file_) std::fclose(file_);
}

void MetricsWriter::write(const Fields& record) {
  const std::string line = record.json() + "\n";
  if (std::fwrite(line.data(), 1, line.size(), file_) != line.size() || std::fflush(file_) != 0) {
    KOLO_THROW(IoError, "writing metrics to ", path_, ": ", std::strerror(errno));
  }
}

}  // namespace kolo::observe
