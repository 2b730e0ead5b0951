// Synchronised batch normalisation (PyTorch's SyncBatchNorm, Horovod's
// SyncBatchNormalization): the batch norms of a data-parallel replica normalise with the
// statistics of the group's global batch instead of the replica's own share, so that N
// replicas train as one process on the global batch, and their running estimates agree.
#pragma once

#include <memory>

#include "kolo/comm/communicator.h"
#include "kolo/nn/module.h"

namespace kolo::parallel {

/// Makes every nn::BatchNorm in `model` (BatchNorm1d, BatchNorm2d) synchronised over `group`
/// (torch.nn.SyncBatchNorm.convert_sync_batchnorm): in training mode each one's forward
/// all-reduces its per-channel count, sum and sum of squares (f64, 2C + 1 values) so that
/// the mean and variance, and the running estimates, are the global batch's; its backward
/// all-reduces the output gradient's two per-channel sums (2C values) before the input's
/// gradient; the weight's and bias's gradients stay each replica's own, for the gradient
/// reduction to average as any parameter's. Eval mode communicates nothing. The module keeps
/// the communicator (shared). Every replica of the group must convert the same model and
/// run its forwards and backwards in step: the all-reduces are collective, on the thread that
/// runs forward or backward. A null group turns synchronisation off again. Returns the number
/// of batch norms changed.
int convertSyncBatchNorm(nn::Module& model, std::shared_ptr<comm::Communicator> group);

}  // namespace kolo::parallel
