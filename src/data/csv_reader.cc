// readCsv: a CSV/TSV file mapped into memory, parsed (parseCsv) and made into tensors.
#include <algorithm>

#include "data/csv_format.h"
#include "data/mapped_file.h"
#include "kolo/data_files.h"

namespace kolo::data {

CsvTable readCsv(const std::string& path, const CsvOptions& options) {
  const std::shared_ptr<const detail::MappedFile> file = detail::MappedFile::open(path);
  CsvColumns columns = parseCsv(file->data(), file->size(), path, options);
  CsvTable table;
  table.inputs = Tensor::empty({columns.rows, columns.features}, DType::F32);
  std::copy(columns.values.begin(), columns.values.end(), table.inputs.data<float>());
  table.labels = Tensor::fromVector({columns.rows}, columns.labels);
  table.featureNames = std::move(columns.featureNames);
  table.classNames = std::move(columns.classNames);
  table.classes = columns.classes;
  return table;
}

}  // namespace kolo::data
