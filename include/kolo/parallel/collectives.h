// Every collective and point-to-point operation of comm::Communicator on Tensors, as
// torch.distributed offers them: the communicator takes raw buffers (comm does not know the
// tensor layer), these check each tensor (defined, contiguous, dtypes and shapes that agree)
// and pass its storage. Blocking unless named i*, collective over every rank of `comm`
// (every rank must call with the same shapes, dtypes and root), and throwing what the
// communicator throws (Timeout, Mismatch, IoError). Checks are local: a tensor that fails
// them throws InvalidArgument naming the operation, the tensor and what was expected, on
// that rank, before any message is sent.
#pragma once

#include <memory>

#include "kolo/comm/communicator.h"
#include "kolo/tensor.h"

namespace kolo::parallel {

/// In place: every rank's `tensor` becomes the reduction (op) of all ranks' (all_reduce).
void allReduce(comm::Communicator& comm, Tensor& tensor, comm::ReduceOp op = comm::ReduceOp::Sum,
               const comm::CollectiveOptions& opts = {});
/// Non-blocking allReduce: `tensor` must stay alive and untouched until the Work completes.
std::unique_ptr<comm::Work> iallReduce(comm::Communicator& comm, Tensor& tensor,
                                       comm::ReduceOp op = comm::ReduceOp::Sum,
                                       const comm::CollectiveOptions& opts = {});

/// In place: every rank's `tensor` becomes root's.
void broadcast(comm::Communicator& comm, Tensor& tensor, int root,
               const comm::CollectiveOptions& opts = {});
/// Non-blocking broadcast: `tensor` must stay alive until the Work completes.
std::unique_ptr<comm::Work> ibroadcast(comm::Communicator& comm, Tensor& tensor, int root,
                                       const comm::CollectiveOptions& opts = {});

/// In place on root: root's `tensor` becomes the reduction of all ranks'; the other ranks'
/// tensors are left as they were.
void reduce(comm::Communicator& comm, Tensor& tensor, int root,
            comm::ReduceOp op = comm::ReduceOp::Sum, const comm::CollectiveOptions& opts = {});

/// `output` [size() * n, ...] receives every rank's `input` [n, ...] concatenated along
/// dimension 0 in rank order (all_gather_into_tensor); a 0-d input gives output [size()].
void allGather(comm::Communicator& comm, const Tensor& input, Tensor& output,
               const comm::CollectiveOptions& opts = {});
/// allGather where ranks' inputs may differ in dimension 0 (the other dimensions agree):
/// returns the concatenation in rank order. Exchanges the row counts first.
Tensor allGatherUneven(comm::Communicator& comm, const Tensor& input,
                       const comm::CollectiveOptions& opts = {});

/// `input` [size() * n, ...]: rank r's `output` [n, ...] receives the reduction of every
/// rank's block r along dimension 0 (reduce_scatter_tensor).
void reduceScatter(comm::Communicator& comm, const Tensor& input, Tensor& output,
                   comm::ReduceOp op = comm::ReduceOp::Sum,
                   const comm::CollectiveOptions& opts = {});

/// Root's `output` [size() * n, ...] receives every rank's `input` [n, ...] in rank order;
/// `output` is not used (may be undefined) on the other ranks.
void gather(comm::Communicator& comm, const Tensor& input, Tensor& output, int root,
            const comm::CollectiveOptions& opts = {});

/// Root's `input` [size() * n, ...] is cut along dimension 0; rank r's `output` [n, ...]
/// receives block r. `input` is not used (may be undefined) on the other ranks.
void scatter(comm::Communicator& comm, const Tensor& input, Tensor& output, int root,
             const comm::CollectiveOptions& opts = {});

/// `input` and `output` [size() * n, ...]: block j of rank i's input lands in block i of
/// rank j's output (all_to_all_single with equal splits).
void allToAll(comm::Communicator& comm, const Tensor& input, Tensor& output,
              const comm::CollectiveOptions& opts = {});

/// Point to point: `tensor` to `peer`, who receives it into a tensor of the same dtype and
/// element count with recv (matched by tag, in order).
void send(comm::Communicator& comm, const Tensor& tensor, int peer, int tag = 0);
void recv(comm::Communicator& comm, Tensor& tensor, int peer, int tag = 0);
/// Non-blocking send/recv: the tensor must stay alive (and, for isend, unchanged) until the
/// Work completes.
std::unique_ptr<comm::Work> isend(comm::Communicator& comm, const Tensor& tensor, int peer,
                                  int tag = 0);
std::unique_ptr<comm::Work> irecv(comm::Communicator& comm, Tensor& tensor, int peer,
                                  int tag = 0);

}  // namespace kolo::parallel
