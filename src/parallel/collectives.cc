// Tensor forms of the Communicator's operations: each checks its tensors here, where the
// shapes are known, and hands the communicator their storage.
#include "kolo/parallel/collectives.h"

#include <string>
#include <vector>

#include "kolo/error.h"

namespace kolo::parallel {
namespace {

// "'name' [2, 3] f32", or without the name when it has none.
std::string describe(const Tensor& t) {
  std::string out;
  if (!t.name().empty()) out.append("'").append(t.name()).append("' ");
  return out.append(shapeString(t.shape())).append(" ").append(dtypeName(t.dtype()));
}

// Defined and contiguous: the communicator reads and writes the storage as one block.
void requireUsable(const char* op, const char* role, const Tensor& t) {
  KOLO_REQUIRE(t.defined(), op, ": ", role, " is undefined");
  KOLO_REQUIRE(t.isContiguous(), op, ": ", role, " ", describe(t),
               " is not contiguous (pass .contiguous())");
}

void requireSameDType(const char* op, const Tensor& input, const Tensor& output) {
  KOLO_REQUIRE(input.dtype() == output.dtype(), op, ": input ", describe(input), " and output ",
               describe(output), " differ in dtype");
}

// `shape` with `n` blocks of it stacked along dimension 0 ([n] for a 0-d shape).
Shape stacked(const Shape& shape, int n) {
  if (shape.empty()) return {n};
  Shape out = shape;
  out[0] *= n;
  return out;
}

void requireShape(const char* op, const char* role, const Tensor& t, const Shape& expected) {
  KOLO_REQUIRE(t.shape() == expected, op, ": ", role, " is ", describe(t), ", expected ",
               shapeString(expected));
}

// The shape of one of `n` blocks of `t` along dimension 0.
Shape blockOf(const char* op, const char* role, const Tensor& t, int n) {
  KOLO_REQUIRE(t.dim() >= 1 && t.size(0) % n == 0, op, ": ", role, " ", describe(t),
               " does not split into ", n, " blocks along dimension 0");
  Shape out = t.shape();
  out[0] /= n;
  return out;
}

size_t count(const Tensor& t) { return static_cast<size_t>(t.numel()); }

}  // namespace

void allReduce(comm::Communicator& comm, Tensor& tensor, comm::ReduceOp op,
               const comm::CollectiveOptions& opts) {
  requireUsable("allReduce", "tensor", tensor);
  comm.allreduce(tensor.rawData(), tensor.rawData(), count(tensor), tensor.dtype(), op, opts);
}

std::unique_ptr<comm::Work> iallReduce(comm::Communicator& comm, Tensor& tensor, comm::ReduceOp op,
                                       const comm::CollectiveOptions& opts) {
  requireUsable("iallReduce", "tensor", tensor);
  return comm.iallreduce(tensor.rawData(), tensor.rawData(), count(tensor), tensor.dtype(), op,
                         opts);
}

void broadcast(comm::Communicator& comm, Tensor& tensor, int root,
               const comm::CollectiveOptions& opts) {
  requireUsable("broadcast", "tensor", tensor);
  comm.broadcast(tensor.rawData(), count(tensor), tensor.dtype(), root, opts);
}

std::unique_ptr<comm::Work> ibroadcast(comm::Communicator& comm, Tensor& tensor, int root,
                                       const comm::CollectiveOptions& opts) {
  requireUsable("ibroadcast", "tensor", tensor);
  return comm.ibroadcast(tensor.rawData(), count(tensor), tensor.dtype(), root, opts);
}

void reduce(comm::Communicator& comm, Tensor& tensor, int root, comm::ReduceOp op,
            const comm::CollectiveOptions& opts) {
  requireUsable("reduce", "tensor", tensor);
  // Algorithms may accumulate in the result buffer on every rank: the other ranks get a
  // scratch one, so their tensors keep their values.
  Tensor result = comm.rank() == root ? tensor : Tensor::empty(tensor.shape(), tensor.dtype());
  comm.reduce(tensor.rawData(), result.rawData(), count(tensor), tensor.dtype(), op, root, opts);
}

void allGather(comm::Communicator& comm, const Tensor& input, Tensor& output,
               const comm::CollectiveOptions& opts) {
  requireUsable("allGather", "input", input);
  requireUsable("allGather", "output", output);
  requireSameDType("allGather", input, output);
  requireShape("allGather", "output", output, stacked(input.shape(), comm.size()));
  comm.allgather(input.rawData(), output.rawData(), count(input), input.dtype(), opts);
}

Tensor allGatherUneven(comm::Communicator& comm, const Tensor& input,
                       const comm::CollectiveOptions& opts) {
  requireUsable("allGatherUneven", "input", input);
  KOLO_REQUIRE(input.dim() >= 1, "allGatherUneven: input ", describe(input),
               " has no dimension 0 to concatenate along");
  // Each rank's rows and elements per row; the rows differ, the row size must not.
  const int n = comm.size();
  const int64_t rowElements = input.size(0) > 0 ? input.numel() / input.size(0) : 0;
  int64_t mine[2] = {input.size(0), rowElements};
  std::vector<int64_t> all(2 * static_cast<size_t>(n));
  comm.allgather(mine, all.data(), 2, DType::I64, opts);
  std::vector<size_t> counts(static_cast<size_t>(n));
  int64_t rows = 0;
  Shape rowShape(input.shape().begin() + 1, input.shape().end());
  const int64_t expectedRow = shapeNumel(rowShape);
  for (int r = 0; r < n; ++r) {
    const int64_t theirRows = all[2 * r], theirRow = all[2 * r + 1];
    if (theirRows > 0 && theirRow != expectedRow)
      KOLO_THROW(Mismatch, "allGatherUneven: rank ", r, " has rows of ", theirRow,
                 " elements but rank ", comm.rank(), " has rows ", shapeString(rowShape));
    counts[static_cast<size_t>(r)] = static_cast<size_t>(theirRows * expectedRow);
    rows += theirRows;
  }
  Shape outShape = input.shape();
  outShape[0] = rows;
  Tensor output = Tensor::empty(outShape, input.dtype());
  comm.allgatherv(input.rawData(), output.rawData(), counts, input.dtype(), opts);
  return output;
}

void reduceScatter(comm::Communicator& comm, const Tensor& input, Tensor& output,
                   comm::ReduceOp op, const comm::CollectiveOptions& opts) {
  requireUsable("reduceScatter", "input", input);
  requireUsable("reduceScatter", "output", output);
  requireSameDType("reduceScatter", input, output);
  requireShape("reduceScatter", "output", output,
               blockOf("reduceScatter", "input", input, comm.size()));
  comm.reduceScatter(input.rawData(), output.rawData(), count(output), input.dtype(), op, opts);
}

void gather(comm::Communicator& comm, const Tensor& input, Tensor& output, int root,
            const comm::CollectiveOptions& opts) {
  requireUsable("gather", "input", input);
  void* destination = nullptr;
  if (comm.rank() == root) {
    requireUsable("gather", "output", output);
    requireSameDType("gather", input, output);
    requireShape("gather", "output", output, stacked(input.shape(), comm.size()));
    destination = output.rawData();
  }
  comm.gather(input.rawData(), destination, count(input), input.dtype(), root, opts);
}

void scatter(comm::Communicator& comm, const Tensor& input, Tensor& output, int root,
             const comm::CollectiveOptions& opts) {
  requireUsable("scatter", "output", output);
  const void* source = nullptr;
  if (comm.rank() == root) {
    requireUsable("scatter", "input", input);
    requireSameDType("scatter", input, output);
    requireShape("scatter", "output", output, blockOf("scatter", "input", input, comm.size()));
    source = input.rawData();
  }
  comm.scatter(source, output.rawData(), count(output), output.dtype(), root, opts);
}

void allToAll(comm::Communicator& comm, const Tensor& input, Tensor& output,
              const comm::CollectiveOptions& opts) {
  requireUsable("allToAll", "input", input);
  requireUsable("allToAll", "output", output);
  requireSameDType("allToAll", input, output);
  const Shape block = blockOf("allToAll", "input", input, comm.size());
  requireShape("allToAll", "output", output, input.shape());
  comm.alltoall(input.rawData(), output.rawData(), static_cast<size_t>(shapeNumel(block)),
                input.dtype(), opts);
}

void send(comm::Communicator& comm, const Tensor& tensor, int peer, int tag) {
  requireUsable("send", "tensor", tensor);
  comm.send(tensor.rawData(), count(tensor), tensor.dtype(), peer, tag);
}

void recv(comm::Communicator& comm, Tensor& tensor, int peer, int tag) {
  requireUsable("recv", "tensor", tensor);
  comm.recv(tensor.rawData(), count(tensor), tensor.dtype(), peer, tag);
}

std::unique_ptr<comm::Work> isend(comm::Communicator& comm, const Tensor& tensor, int peer,
                                  int tag) {
  requireUsable("isend", "tensor", tensor);
  return comm.isend(tensor.rawData(), count(tensor), tensor.dtype(), peer, tag);
}

std::unique_ptr<comm::Work> irecv(comm::Communicator& comm, Tensor& tensor, int peer, int tag) {
  requireUsable("irecv", "tensor", tensor);
  return comm.irecv(tensor.rawData(), count(tensor), tensor.dtype(), peer, tag);
}

}  // namespace kolo::parallel
