// An in-process Communicator for K replicas running on K threads of one process (the
// Mirrored strategy's replicas, and ranks-as-threads tests): collectives are computed
// directly over the replicas' buffers with a selectable in-memory reduction.
#pragma once

#include <chrono>
#include <memory>
#include <string>
#include <vector>

#include "kolo/comm/communicator.h"

namespace kolo::parallel {

/// How the replicas' buffers are combined (TensorFlow's cross-device ops).
enum class LocalReduction {
  ReduceToOne,       // replica 0 sums every buffer, the others copy the result
  HierarchicalCopy,  // two groups reduce to their leaders, leaders combine, results flow back
  Ring,              // chunked ring: K-1 reduce-scatter steps then K-1 all-gather steps
};

const char* localReductionName(LocalReduction reduction);
/// Parses "reduce-to-one", "hierarchical-copy" or "ring"; throws InvalidArgument otherwise.
LocalReduction parseLocalReduction(const std::string& name);

/// Creates the K communicators of one replica group; replica r must use element r from its
/// own thread. Supported: allreduce / iallreduce (sum, avg, min, max over f32, f64, i32,
/// i64), broadcast / ibroadcast, barrier and allgather; other operations throw
/// InvalidArgument. Non-blocking operations make progress inside wait(), and a replica's
/// waits complete its earlier operations first, so every replica must eventually wait on
/// each Work (or destroy it). A replica that does not arrive within `timeout` makes the
/// others throw Timeout naming it. Every result is bit-identical on all replicas.
std::vector<std::shared_ptr<comm::Communicator>> makeReplicaGroup(
    int replicas, LocalReduction reduction = LocalReduction::Ring,
    std::chrono::milliseconds timeout = std::chrono::minutes(5));

/// Breaks the group of `member` (one of makeReplicaGroup's communicators): every replica
/// waiting in or later calling a collective throws Timeout carrying `reason`. A replica that
/// fails mid-step calls it so that the others stop at once instead of at their deadline.
/// Throws InvalidArgument when `member` is not a replica-group communicator.
void abortReplicaGroup(comm::Communicator& member, const std::string& reason);

}  // namespace kolo::parallel
