// ProcessGroupKolo's operations: argument checks on the caller's thread, then a body that
// the worker runs in issue order. Non-contiguous tensors go through contiguous copies; what
// kolo's Communicator lacks (variable all-to-all, reductions without a kernel) is composed.
#include <ATen/ATen.h>
#include <c10/util/Exception.h>

#include "process_group.h"

namespace kolo_torch {
namespace {

void checkCpu(const at::Tensor& t, const char* what) {
  TORCH_CHECK(t.defined(), "kolo: ", what, " got an undefined tensor");
  TORCH_CHECK(t.device().is_cpu(), "kolo: ", what, " takes CPU tensors, got one on ", t.device());
  TORCH_CHECK(!t.is_sparse(), "kolo: ", what, " does not take sparse tensors");
}

at::Tensor& single(std::vector<at::Tensor>& tensors, const char* what) {
  TORCH_CHECK(tensors.size() == 1, "kolo: ", what, " takes exactly one tensor per rank, got ", tensors.size());
  checkCpu(tensors[0], what);
  return tensors[0];
}

void checkRoot(int64_t root, int size, const char* what) {
  TORCH_CHECK(root >= 0 && root < size, "kolo: ", what, ": root ", root, " outside the group of ", size);
}

void checkLike(const at::Tensor& t, const at::Tensor& like, const char* what) {
  checkCpu(t, what);
  TORCH_CHECK(t.scalar_type() == like.scalar_type(), "kolo: ", what, ": tensors of ", t.scalar_type(), " and ",
              like.scalar_type(), " mixed");
  TORCH_CHECK(t.numel() == like.numel(), "kolo: ", what, ": a tensor of ", t.numel(), " elements where ",
              like.numel(), " were expected");
}

/// `t` if contiguous, else a contiguous copy (written back by writeBack).
at::Tensor dense(const at::Tensor& t) { return t.is_contiguous() ? t : t.contiguous(); }
void writeBack(at::Tensor& t, const at::Tensor& dense) {
  if (!dense.is_same(t)) t.copy_(dense);
}

/// One flat buffer holding `tensors` one after another (their dtype).
at::Tensor flatten(const std::vector<at::Tensor>& tensors) {
  std::vector<at::Tensor> flat;
  flat.reserve(tensors.size());
  for (const auto& t : tensors) flat.push_back(t.reshape({-1}));
  return at::cat(flat);
}
/// Copies consecutive slices of `flat` into `tensors`.
void unflatten(const at::Tensor& flat, std::vector<at::Tensor>& tensors) {
  int64_t offset = 0;
  for (auto& t : tensors) {
    t.copy_(flat.narrow(0, offset, t.numel()).view(t.sizes()));
    offset += t.numel();
  }
}

}  // namespace

c10::intrusive_ptr<c10d::Work> ProcessGroupKolo::broadcast(std::vector<at::Tensor>& tensors,
                                                           const c10d::BroadcastOptions& opts) {
  at::Tensor t = single(tensors, "broadcast");
  checkRoot(opts.rootRank, getSize(), "broadcast");
  const int root = static_cast<int>(opts.rootRank);
  return enqueue("broadcast", c10d::OpType::BROADCAST, {t}, [this, t, root](KoloWork&) mutable {
    at::Tensor d = dense(t);
    group_->broadcast(d.data_ptr(), d.nbytes(), root);
    writeBack(t, d);
  });
}

c10::intrusive_ptr<c10d::Work> ProcessGroupKolo::allreduce(std::vector<at::Tensor>& tensors,
                                                           const c10d::AllreduceOptions& opts) {
  at::Tensor t = single(tensors, "allreduce");
  checkReduce(t, opts.reduceOp, "allreduce");
  const c10d::ReduceOp op = opts.reduceOp;
  return enqueue("allreduce", c10d::OpType::ALLREDUCE, {t}, [this, t, op](KoloWork&) mutable {
    at::Tensor d = dense(t);
    allreduceInPlace(d, op);
    writeBack(t, d);
  });
}

c10::intrusive_ptr<c10d::Work> ProcessGroupKolo::allreduce_coalesced(std::vector<at::Tensor>& tensors,
                                                                     const c10d::AllreduceCoalescedOptions& opts) {
  TORCH_CHECK(!tensors.empty(), "kolo: allreduce_coalesced got no tensors");
  for (const auto& t : tensors) {
    checkCpu(t, "allreduce_coalesced");
    TORCH_CHECK(t.scalar_type() == tensors[0].scalar_type(), "kolo: allreduce_coalesced: tensors of ",
                t.scalar_type(), " and ", tensors[0].scalar_type(), " mixed");
  }
  checkReduce(tensors[0], opts.reduceOp, "allreduce_coalesced");
  const c10d::ReduceOp op = opts.reduceOp;
  return enqueue("allreduce_coalesced", c10d::OpType::ALLREDUCE_COALESCED, tensors,
                 [this, tensors, op](KoloWork&) mutable {
                   at::Tensor flat = flatten(tensors);
                   allreduceInPlace(flat, op);
                   unflatten(flat, tensors);
                 });
}

c10::intrusive_ptr<c10d::Work> ProcessGroupKolo::reduce(std::vector<at::Tensor>& tensors,
                                                        const c10d::ReduceOptions& opts) {
  at::Tensor t = single(tensors, "reduce");
  checkReduce(t, opts.reduceOp, "reduce");
  checkRoot(opts.rootRank, getSize(), "reduce");
  const c10d::ReduceOp op = opts.reduceOp;
  const int root = static_cast<int>(opts.rootRank);
  return enqueue("reduce", c10d::OpType::REDUCE, {t}, [this, t, op, root](KoloWork&) mutable {
    at::Tensor d = dense(t);
    reduceInPlace(d, op, root);
    writeBack(t, d);
  });
}

c10::intrusive_ptr<c10d::Work> ProcessGroupKolo::allgather(std::vector<std::vector<at::Tensor>>& outputs,
                                                           std::vector<at::Tensor>& inputs,
                                                           const c10d::AllgatherOptions&) {
  at::Tensor in = single(inputs, "allgather");
  TORCH_CHECK(outputs.size() == 1 && outputs[0].size() == static_cast<size_t>(getSize()),
              "kolo: allgather needs one list of ", getSize(), " output tensors");
  for (const auto& o : outputs[0]) checkLike(o, in, "allgather");
  std::vector<at::Tensor> outs = outputs[0];
  return enqueue("allgather", c10d::OpType::ALLGATHER, outs, [this, in, outs](KoloWork&) mutable {
    at::Tensor d = dense(in);
    at::Tensor flat = at::empty({getSize() * d.numel()}, d.options());
    group_->allgather(d.data_ptr(), flat.data_ptr(), d.nbytes());
    unflatten(flat, outs);
  });
}

c10::intrusive_ptr<c10d::Work> ProcessGroupKolo::_allgather_base(at::Tensor& output, at::Tensor& input,
                                                                 const c10d::AllgatherOptions&) {
  checkCpu(input, "_allgather_base");
  checkCpu(output, "_allgather_base");
  TORCH_CHECK(output.scalar_type() == input.scalar_type(), "kolo: _allgather_base: output of ",
              output.scalar_type(), " for input of ", input.scalar_type());
  TORCH_CHECK(output.numel() == getSize() * input.numel(), "kolo: _allgather_base: output of ", output.numel(),
              " elements, expected ", getSize(), " x ", input.numel());
  at::Tensor out = output, in = input;
  return enqueue("_allgather_base", c10d::OpType::_ALLGATHER_BASE, {out}, [this, out, in](KoloWork&) mutable {
    at::Tensor d = dense(in), o = dense(out);
    group_->allgather(d.data_ptr(), o.data_ptr(), d.nbytes());
    writeBack(out, o);
  });
}

c10::intrusive_ptr<c10d::Work> ProcessGroupKolo::allgather_coalesced(std::vector<std::vector<at::Tensor>>& outputs,
                                                                     std::vector<at::Tensor>& inputs,
                                                                     const c10d::AllgatherOptions&) {
  TORCH_CHECK(outputs.size() == static_cast<size_t>(getSize()), "kolo: allgather_coalesced needs ", getSize(),
              " output lists");
  for (const auto& list : outputs) {
    TORCH_CHECK(list.size() == inputs.size(), "kolo: allgather_coalesced: an output list of ", list.size(),
                " tensors for ", inputs.size(), " inputs");
    for (size_t i = 0; i < list.size(); ++i) checkLike(list[i], inputs[i], "allgather_coalesced");
  }
  for (size_t i = 1; i < inputs.size(); ++i)
    TORCH_CHECK(inputs[i].scalar_type() == inputs[0].scalar_type(), "kolo: allgather_coalesced: mixed dtypes");
  std::vector<at::Tensor> outs;
  for (const auto& list : outputs) outs.insert(outs.end(), list.begin(), list.end());
  std::vector<at::Tensor> ins = inputs;
  return enqueue("allgather_coalesced", c10d::OpType::ALLGATHER_COALESCED, outs, [this, ins, outs](KoloWork&) mutable {
    at::Tensor flat = flatten(ins);
    at::Tensor all = at::empty({getSize() * flat.numel()}, flat.options());
    group_->allgather(flat.data_ptr(), all.data_ptr(), flat.nbytes());
    unflatten(all, outs);
  });
}

c10::intrusive_ptr<c10d::Work> ProcessGroupKolo::gather(std::vector<std::vector<at::Tensor>>& outputs,
                                                        std::vector<at::Tensor>& inputs,
                                                        const c10d::GatherOptions& opts) {
  at::Tensor in = single(inputs, "gather");
  checkRoot(opts.rootRank, getSize(), "gather");
  const int root = static_cast<int>(opts.rootRank);
  std::vector<at::Tensor> outs;
  if (getRank() == root) {
    TORCH_CHECK(outputs.size() == 1 && outputs[0].size() == static_cast<size_t>(getSize()),
                "kolo: gather needs one list of ", getSize(), " output tensors on the root");
    for (const auto& o : outputs[0]) checkLike(o, in, "gather");
    outs = outputs[0];
  } else {
    TORCH_CHECK(outputs.empty() || (outputs.size() == 1 && outputs[0].empty()),
                "kolo: gather takes output tensors only on the root (rank ", root, ")");
  }
  return enqueue("gather", c10d::OpType::GATHER, outs, [this, in, outs, root](KoloWork&) mutable {
    at::Tensor d = dense(in);
    at::Tensor flat = at::empty({getRank() == root ? getSize() * d.numel() : 0}, d.options());
    group_->gather(d.data_ptr(), flat.data_ptr(), d.nbytes(), root);
    if (getRank() == root) unflatten(flat, outs);
  });
}

c10::intrusive_ptr<c10d::Work> ProcessGroupKolo::scatter(std::vector<at::Tensor>& outputs,
                                                         std::vector<std::vector<at::Tensor>>& inputs,
                                                         const c10d::ScatterOptions& opts) {
  at::Tensor out = single(outputs, "scatter");
  checkRoot(opts.rootRank, getSize(), "scatter");
  const int root = static_cast<int>(opts.rootRank);
  std::vector<at::Tensor> ins;
  if (getRank() == root) {
    TORCH_CHECK(inputs.size() == 1 && inputs[0].size() == static_cast<size_t>(getSize()),
                "kolo: scatter needs one list of ", getSize(), " input tensors on the root");
    for (const auto& i : inputs[0]) checkLike(i, out, "scatter");
    ins = inputs[0];
  } else {
    TORCH_CHECK(inputs.empty() || (inputs.size() == 1 && inputs[0].empty()),
                "kolo: scatter takes input tensors only on the root (rank ", root, ")");
  }
  return enqueue("scatter", c10d::OpType::SCATTER, {out}, [this, ins, out, root](KoloWork&) mutable {
    at::Tensor o = dense(out);
    at::Tensor flat = ins.empty() ? at::empty({0}, o.options()) : flatten(ins);
    group_->scatter(flat.data_ptr(), o.data_ptr(), o.nbytes(), root);
    writeBack(out, o);
  });
}

c10::intrusive_ptr<c10d::Work> ProcessGroupKolo::reduce_scatter(std::vector<at::Tensor>& outputs,
                                                                std::vector<std::vector<at::Tensor>>& inputs,
                                                                const c10d::ReduceScatterOptions& opts) {
  at::Tensor out = single(outputs, "reduce_scatter");
  TORCH_CHECK(inputs.size() == 1 && inputs[0].size() == static_cast<size_t>(getSize()),
              "kolo: reduce_scatter needs one list of ", getSize(), " input tensors");
  for (const auto& i : inputs[0]) {
    checkCpu(i, "reduce_scatter");
    TORCH_CHECK(i.scalar_type() == out.scalar_type(), "kolo: reduce_scatter: mixed dtypes");
  }
  TORCH_CHECK(inputs[0][getRank()].numel() == out.numel(), "kolo: reduce_scatter: output of ", out.numel(),
              " elements for this rank's input of ", inputs[0][getRank()].numel());
  checkReduce(out, opts.reduceOp, "reduce_scatter");
  const c10d::ReduceOp op = opts.reduceOp;
  std::vector<at::Tensor> ins = inputs[0];
  return enqueue("reduce_scatter", c10d::OpType::REDUCE_SCATTER, {out}, [this, ins, out, op](KoloWork&) mutable {
    at::Tensor flat = flatten(ins);
    bool even = true;
    int64_t offset = 0;
    for (int r = 0; r < getRank(); ++r) offset += ins[r].numel();
    for (const auto& i : ins) even = even && i.numel() == out.numel();
    reduceScatterFlat(flat, out, op, even, offset);
  });
}

c10::intrusive_ptr<c10d::Work> ProcessGroupKolo::_reduce_scatter_base(at::Tensor& output, at::Tensor& input,
                                                                      const c10d::ReduceScatterOptions& opts) {
  checkCpu(input, "_reduce_scatter_base");
  checkCpu(output, "_reduce_scatter_base");
  TORCH_CHECK(output.scalar_type() == input.scalar_type(), "kolo: _reduce_scatter_base: mixed dtypes");
  TORCH_CHECK(input.numel() == getSize() * output.numel(), "kolo: _reduce_scatter_base: input of ", input.numel(),
              " elements, expected ", getSize(), " x ", output.numel());
  checkReduce(output, opts.reduceOp, "_reduce_scatter_base");
  const c10d::ReduceOp op = opts.reduceOp;
  at::Tensor out = output, in = input;
  return enqueue("_reduce_scatter_base", c10d::OpType::_REDUCE_SCATTER_BASE, {out},
                 [this, in, out, op](KoloWork&) mutable {
                   reduceScatterFlat(dense(in).view({-1}), out, op, true, getRank() * out.numel());
                 });
}

c10::intrusive_ptr<c10d::Work> ProcessGroupKolo::alltoall_base(at::Tensor& output, at::Tensor& input,
                                                               std::vector<int64_t>& outputSplits,
                                                               std::vector<int64_t>& inputSplits,
                                                               const c10d::AllToAllOptions&) {
  checkCpu(input, "alltoall_base");
  checkCpu(output, "alltoall_base");
  TORCH_CHECK(output.scalar_type() == input.scalar_type(), "kolo: alltoall_base: mixed dtypes");
  const int n = getSize();
  // Splits count rows (the first dimension); empty splits mean equal parts.
  auto blocks = [&](const at::Tensor& t, const std::vector<int64_t>& splits, const char* side) {
    const int64_t rows = t.dim() == 0 ? 1 : t.size(0);
    const size_t rowBytes = rows == 0 ? 0 : t.nbytes() / static_cast<size_t>(rows);
    std::vector<size_t> bytes(n), offsets(n);
    if (splits.empty()) {
      TORCH_CHECK(rows % n == 0, "kolo: alltoall_base: ", side, " of ", rows, " rows does not split into ", n);
      for (int r = 0; r < n; ++r) bytes[r] = rowBytes * static_cast<size_t>(rows / n);
    } else {
      TORCH_CHECK(splits.size() == static_cast<size_t>(n), "kolo: alltoall_base: ", splits.size(), " ", side,
                  " splits for ", n, " ranks");
      int64_t total = 0;
      for (int r = 0; r < n; ++r) {
        TORCH_CHECK(splits[r] >= 0, "kolo: alltoall_base: negative ", side, " split");
        bytes[r] = rowBytes * static_cast<size_t>(splits[r]);
        total += splits[r];
      }
      TORCH_CHECK(total == rows, "kolo: alltoall_base: ", side, " splits add up to ", total, " rows, the tensor has ",
                  rows);
    }
    for (int r = 1; r < n; ++r) offsets[r] = offsets[r - 1] + bytes[r - 1];
    return std::make_pair(bytes, offsets);
  };
  auto [sendBytes, sendOffsets] = blocks(input, inputSplits, "input");
  auto [recvBytes, recvOffsets] = blocks(output, outputSplits, "output");
  at::Tensor out = output, in = input;
  return enqueue("alltoall_base", c10d::OpType::ALLTOALL_BASE, {out},
                 [this, in, out, sendBytes = sendBytes, sendOffsets = sendOffsets, recvBytes = recvBytes,
                  recvOffsets = recvOffsets](KoloWork&) mutable {
                   at::Tensor d = dense(in), o = dense(out);
                   bool even = true;
                   for (int r = 0; r < getSize(); ++r)
                     even = even && sendBytes[r] == sendBytes[0] && recvBytes[r] == sendBytes[0];
                   if (even) {
                     group_->alltoall(d.data_ptr(), o.data_ptr(), sendBytes[0]);
                   } else {
                     group_->alltoallv(d.data_ptr(), sendBytes, sendOffsets, o.data_ptr(), recvBytes, recvOffsets);
                   }
                   writeBack(out, o);
                 });
}

c10::intrusive_ptr<c10d::Work> ProcessGroupKolo::alltoall(std::vector<at::Tensor>& outputs,
                                                          std::vector<at::Tensor>& inputs,
                                                          const c10d::AllToAllOptions&) {
  const int n = getSize();
  TORCH_CHECK(outputs.size() == static_cast<size_t>(n) && inputs.size() == static_cast<size_t>(n),
              "kolo: alltoall needs ", n, " input and ", n, " output tensors");
  std::vector<size_t> sendBytes(n), sendOffsets(n), recvBytes(n), recvOffsets(n);
  for (int r = 0; r < n; ++r) {
    checkCpu(inputs[r], "alltoall");
    checkCpu(outputs[r], "alltoall");
    TORCH_CHECK(inputs[r].scalar_type() == inputs[0].scalar_type() &&
                    outputs[r].scalar_type() == inputs[0].scalar_type(),
                "kolo: alltoall: mixed dtypes");
    sendBytes[r] = inputs[r].nbytes();
    recvBytes[r] = outputs[r].nbytes();
    if (r > 0) {
      sendOffsets[r] = sendOffsets[r - 1] + sendBytes[r - 1];
      recvOffsets[r] = recvOffsets[r - 1] + recvBytes[r - 1];
    }
  }
  std::vector<at::Tensor> ins = inputs, outs = outputs;
  return enqueue("alltoall", c10d::OpType::ALLTOALL, outs,
                 [this, ins, outs, sendBytes, sendOffsets, recvBytes, recvOffsets](KoloWork&) mutable {
                   at::Tensor flatIn = flatten(ins);
                   int64_t total = 0;
                   for (const auto& o : outs) total += o.numel();
                   at::Tensor flatOut = at::empty({total}, flatIn.options());
                   group_->alltoallv(flatIn.data_ptr(), sendBytes, sendOffsets, flatOut.data_ptr(), recvBytes,
                                     recvOffsets);
                   unflatten(flatOut, outs);
                 });
}

c10::intrusive_ptr<c10d::Work> ProcessGroupKolo::send(std::vector<at::Tensor>& tensors, int dst, int tag) {
  at::Tensor t = single(tensors, "send");
  checkRoot(dst, getSize(), "send");
  TORCH_CHECK(dst != getRank(), "kolo: send on rank ", getRank(), " to itself");
  TORCH_CHECK(tag >= 0, "kolo: send: tag ", tag, " is negative");
  return enqueue(
      "send", c10d::OpType::SEND, {t},
      [this, t, dst, tag](KoloWork& work) {
        at::Tensor d = dense(t);
        auto transfer = group_->send(d.data_ptr(), d.nbytes(), dst, tag);
        // The staging slot keeps a contiguous copy alive until the transfer is done.
        postTransfer(work, *current_ + " to rank " + std::to_string(dst), std::move(transfer), d);
      },
      true);
}

c10::intrusive_ptr<c10d::Work> ProcessGroupKolo::recv(std::vector<at::Tensor>& tensors, int src, int tag) {
  checkRoot(src, getSize(), "recv");
  TORCH_CHECK(src != getRank(), "kolo: recv on rank ", getRank(), " from itself");
  return receive(tensors, src, tag);
}

c10::intrusive_ptr<c10d::Work> ProcessGroupKolo::recvAnysource(std::vector<at::Tensor>& tensors, int tag) {
  TORCH_CHECK(getSize() > 1, "kolo: recv from any rank on a group of one rank");
  return receive(tensors, -1, tag);
}

c10::intrusive_ptr<c10d::Work> ProcessGroupKolo::receive(std::vector<at::Tensor>& tensors, int src, int tag) {
  at::Tensor t = single(tensors, "recv");
  TORCH_CHECK(tag >= 0, "kolo: recv: tag ", tag, " is negative");
  return enqueue(
      "recv", c10d::OpType::RECV, {t},
      [this, t, src, tag](KoloWork& work) {
        at::Tensor d = dense(t);
        auto transfer = group_->recv(d.data_ptr(), d.nbytes(), src, tag);
        work.setSourceRank(src);
        const std::string what = *current_ + (src < 0 ? " from any rank" : " from rank " + std::to_string(src));
        if (d.is_same(t)) {
          postTransfer(work, what, std::move(transfer));
        } else {
          postTransfer(work, what, std::move(transfer), d, t);
        }
      },
      true);
}

c10::intrusive_ptr<c10d::Work> ProcessGroupKolo::barrier(const c10d::BarrierOptions&) {
  return enqueue("barrier", c10d::OpType::BARRIER, {}, [this](KoloWork&) { group_->barrier(); });
}

}  // namespace kolo_torch
