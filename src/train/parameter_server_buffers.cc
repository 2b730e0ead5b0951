// A parameter-server job's buffers (a batch norm's running statistics) travel through the
// job's store, not the servers: each worker publishes its own after every unit, and the chief
// takes their mean over the workers when it evaluates, checkpoints or ends.
#include <cstring>

#include "kolo/error.h"
#include "parallel/ps/store_keys.h"
#include "train/parameter_server_roles.h"

namespace kolo::train::detail {
namespace {

namespace ps = parallel::ps;

bool isCount(DType dtype) {
  return dtype == DType::I32 || dtype == DType::I64 || dtype == DType::U8;
}

size_t bufferBytes(const nn::Module& model) {
  size_t total = 0;
  for (const auto& [name, buffer] : model.namedBuffers()) total += buffer.nbytes();
  return total;
}

}  // namespace

comm::Bytes packBuffers(const nn::Module& model) {
  comm::Bytes bytes;
  for (const auto& [name, buffer] : model.namedBuffers()) {
    const Tensor values = buffer.contiguous();
    const auto* p = static_cast<const uint8_t*>(values.rawData());
    bytes.insert(bytes.end(), p, p + values.nbytes());
  }
  return bytes;
}

void unpackBuffers(nn::Module& model, const comm::Bytes& bytes, const std::string& from) {
  if (bytes.size() != bufferBytes(model))
    KOLO_THROW(FormatError, from, " holds ", bytes.size(),
               " bytes of buffers, the model's buffers take ", bufferBytes(model));
  size_t offset = 0;
  for (auto& [name, buffer] : model.namedBuffers()) {
    KOLO_REQUIRE(buffer.isContiguous(), "parameter servers: buffer ", name, " is not contiguous");
    std::memcpy(buffer.rawData(), bytes.data() + offset, buffer.nbytes());
    offset += buffer.nbytes();
  }
}

void copyBuffers(const nn::Module& from, nn::Module& to) {
  const auto source = from.namedBuffers();
  auto target = to.namedBuffers();
  KOLO_CHECK_EQ(source.size(), target.size(), "buffers of the worker's two replicas");
  for (size_t i = 0; i < source.size(); ++i) target[i].second.copyFrom(source[i].second);
}

void publishBuffers(comm::Store& store, int worker, const nn::Module& model) {
  store.set(ps::workerBuffersKey(worker), packBuffers(model));
}

int averageBuffers(comm::Store& store, int workers, std::chrono::milliseconds timeout,
                   const comm::Bytes& start, nn::Module& model) {
  std::vector<std::string> keys;
  for (int w = 0; w < workers; ++w) keys.push_back(ps::workerBuffersKey(w));
  const std::vector<bool> present = store.checkEach(keys);
  std::vector<std::string> published;
  for (int w = 0; w < workers; ++w)
    if (present[static_cast<size_t>(w)]) published.push_back(keys[static_cast<size_t>(w)]);
  if (published.empty()) return 0;  // no worker finished a unit yet: the buffers stay
  const std::vector<comm::Bytes> values = store.multiGet(published, timeout);
  const size_t expected = bufferBytes(model);
  KOLO_CHECK_EQ(start.size(), expected, "bytes of the buffers the workers started from");
  for (size_t k = 0; k < values.size(); ++k)
    if (values[k].size() != expected)
      KOLO_THROW(FormatError, "the store's ", published[k], " holds ", values[k].size(),
                 " bytes of buffers, the model's buffers take ", expected);
  size_t offset = 0;
  for (auto& [name, buffer] : model.namedBuffers()) {
    KOLO_REQUIRE(buffer.isContiguous(), "parameter servers: buffer ", name, " is not contiguous");
    const DType dtype = buffer.dtype();
    const bool count = isCount(dtype);
    for (int64_t i = 0; i < buffer.numel(); ++i) {
      // Workers in index order, summed in f64: every chief computes the same bits.
      double sum = 0.0;
      for (const comm::Bytes& bytes : values)
        sum += loadElement(dtype, bytes.data() + offset, static_cast<size_t>(i));
      const double n = static_cast<double>(values.size());
      // A counter: what every worker started from, plus what each added since.
      const double from =
          count ? loadElement(dtype, start.data() + offset, static_cast<size_t>(i)) : 0.0;
      storeElement(dtype, buffer.rawData(), static_cast<size_t>(i),
                   count ? from + (sum - n * from) : sum / n);
    }
    offset += buffer.nbytes();
  }
  return static_cast<int>(values.size());
}

}  // namespace kolo::train::detail
