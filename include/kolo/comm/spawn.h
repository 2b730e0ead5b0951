// Running a function on N local ranks without a launcher, as torch.multiprocessing.spawn
// and horovod.run do: each rank a forked process with its own connected native
// communicator; a rank that fails stops the others and is named in the caller's exception.
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "kolo/comm/communicator.h"
#include "kolo/comm/native.h"

namespace kolo::comm {

/// How local ranks are placed on CPUs (`kolo run --bind`, `kolo bench --bind`).
enum class CpuBinding {
  /// Ranks inherit the launcher's affinity; the scheduler places them.
  None,
  /// Each rank is bound to one CPU of the launcher's allowed set (round robin).
  Core,
};

/// Parses "none" or "core"; throws InvalidArgument naming the text otherwise.
CpuBinding parseCpuBinding(const std::string& text);
/// "none" or "core".
const char* cpuBindingName(CpuBinding binding);

struct SpawnOptions {
  /// The ranks' communicator settings (deadline, shared memory, algorithm, store prefix...);
  /// every rank gets the same.
  NativeOptions native;
  /// Core: rank i runs on the i-th CPU (modulo their count) that the calling thread may use,
  /// as `kolo run` binds its ranks; None: the scheduler places them. One rank is never bound.
  CpuBinding bind = CpuBinding::Core;
};

/// What each rank runs: its communicator (rank(), size()) in, its result out.
using RankFunction = std::function<int(std::shared_ptr<Communicator> comm)>;

/// Runs `fn` on `ranks` local ranks and returns the value each returned, by rank. Blocks
/// until every rank has ended.
///
/// Each rank is a child process forked from the calling thread: it binds itself as
/// `options.bind` says, builds a native communicator over a file store in a private
/// directory under TMPDIR (removed before the call returns or throws), calls `fn`, and
/// exits without running the parent's atexit handlers or static destructors (its stdout,
/// stderr and std::cout are flushed first). Ranks inherit stdin, stdout and stderr and the
/// environment; the parent's stdout and stderr are flushed before forking. A rank gets
/// SIGKILL when the calling thread ends (PR_SET_PDEATHSIG), so no rank outlives its parent;
/// processes a rank starts itself are its own to stop.
///
/// Fork safety: the ranks are copies of the calling process with only the calling thread;
/// call spawn before starting threads of one's own (or any that hold a lock a rank could
/// need), as torch's "fork" start method asks.
///
/// A rank fails when `fn` throws, when it ends its process with a non-zero status without
/// returning (exit(3)), or when it dies of a signal; ending the process with status 0 counts
/// as returning 0. The first failure stops the ranks still running (SIGTERM, set back to its
/// default action and unblocked in each rank) so that none waits out its deadline for the
/// failed one, and spawn throws PeerError naming the rank and what happened: "rank 1 of 4
/// failed: kolo::Timeout: <the exception's message>", "rank 2 of 4 died of signal 9
/// (SIGKILL)", "rank 0 of 2 exited with status 3 before its function returned". A PeerError
/// within a rank usually follows another's failure, so another rank's own failure is named
/// in preference; the ranks that failed as well are listed after it. A non-zero value that
/// `fn` returns is a result, not a failure, and stops no one; a rank that returns while its
/// peers still wait for it in a collective makes them fail with PeerError.
///
/// Throws InvalidArgument for ranks < 1 or an empty `fn`, IoError when the store directory,
/// a pipe or a fork cannot be made (the ranks already started are killed and reaped first).
std::vector<int> spawn(int ranks, const RankFunction& fn, const SpawnOptions& options = {});

}  // namespace kolo::comm
