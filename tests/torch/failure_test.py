"""Failure over backend "kolo": a rank killed with SIGKILL, and ranks that issue different
collectives, end every other rank's call in a RuntimeError naming the rank and the
collective (within the group's timeout: the launcher kills a rank that hangs instead), at 2
and 4 ranks."""
import datetime
import os
import signal
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import ranks  # noqa: E402


def worker(case):
    import torch
    import torch.distributed as dist
    import kolo_torch  # noqa: F401

    dist.init_process_group("kolo", timeout=datetime.timedelta(seconds=5))
    r = dist.get_rank()
    store = dist.distributed_c10d._get_default_store()

    def report(msg, survivors):
        # Survivors stay until each has its error: one leaving early would be the next
        # "vanished" rank another survivor names.
        print(f"rank {r}: RuntimeError: {msg}", flush=True)
        store.add(f"reported/{case}", 1)
        while store.add(f"reported/{case}", 0) < survivors:
            time.sleep(0.01)
        sys.exit(0)

    t = torch.ones(1000)
    dist.all_reduce(t)
    if case == "kill":
        # Rank 1 dies only once every other rank has finished the first all-reduce: before
        # that, a survivor still inside it would rightly report rank 1 gone there instead.
        store.add(f"first-done/{case}", 1)
        if r == 1:
            while store.add(f"first-done/{case}", 0) < dist.get_world_size():
                time.sleep(0.01)
            os.kill(os.getpid(), signal.SIGKILL)
        try:
            dist.all_reduce(t)
        except RuntimeError as e:
            msg = str(e)
            assert "rank 1" in msg and "allreduce" in msg, f"the error does not name rank 1 and allreduce: {msg}"
            report(msg, dist.get_world_size() - 1)
        sys.exit(f"rank {r}: all_reduce returned although rank 1 was killed")
    if case == "mismatch":
        try:
            if r == 0:
                dist.all_reduce(torch.ones(10))
            else:
                dist.broadcast(torch.ones(20), src=0)
        except RuntimeError as e:
            msg = str(e)
            assert "allreduce" in msg or "broadcast" in msg, f"the error names no collective: {msg}"
            report(msg, 2)
        sys.exit(f"rank {r}: mismatched collectives returned")


def shm_entries():
    try:
        return set(os.listdir("/dev/shm"))
    except OSError:
        return set()


def main():
    before = shm_entries()
    # At 4 ranks a survivor may wait on a live rank that waits on the dead one: it runs out
    # of time naming both.
    for world in (2, 4):
        results = ranks.launch(os.path.abspath(__file__), world, args=["kill"], deadline_s=60)
        killed_rc = results[1][0]
        if killed_rc != -signal.SIGKILL:
            print(f"FAIL: rank 1 of {world} was to be killed by SIGKILL, it exited {killed_rc}")
            sys.exit(1)
        ranks.require_all_ok(results[:1] + results[2:], f"killed rank of {world}")
    ranks.require_all_ok(ranks.launch(os.path.abspath(__file__), 2, args=["mismatch"], deadline_s=60),
                         "mismatched collectives")
    # Open MPI's segments carry their host's name (kolo-h1 in the netns tests beside this one).
    left = [e for e in shm_entries() - before
            if "kolo" in e and not e.startswith(("vader_segment.", "sm_segment."))]
    if left:
        print(f"FAIL: /dev/shm entries left behind: {left}")
        sys.exit(1)


if __name__ == "__main__":
    if len(sys.argv) > 2 and sys.argv[1] == "--worker":
        worker(sys.argv[2])
    else:
        main()
