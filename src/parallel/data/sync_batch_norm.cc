// convertSyncBatchNorm: each nn::BatchNorm of a replica gets a group sum that all-reduces
// its statistics over the data-parallel group.
#include "kolo/parallel/sync_batch_norm.h"

#include "kolo/nn/batch_norm.h"

namespace kolo::parallel {

int convertSyncBatchNorm(nn::Module& model, std::shared_ptr<comm::Communicator> group) {
  GroupSum sum;
  if (group) {
    sum = [group](std::vector<double>& values) {
      if (group->size() > 1)
        group->allreduce(values.data(), values.data(), values.size(), DType::F64, comm::ReduceOp::Sum);
    };
  }
  int converted = 0;
  for (const auto& [name, module] : model.namedModules()) {
    if (auto* norm = dynamic_cast<nn::BatchNorm*>(module)) {
      norm->setGroupSum(sum);
      ++converted;
    }
  }
  return converted;
}

}  // namespace kolo::parallel
