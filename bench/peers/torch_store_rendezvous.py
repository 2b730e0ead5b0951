#!/usr/bin/python3
"""PyTorch 1.13's TCPStore doing what an init does, for bench/rendezvous.sh: N simulated
ranks as threads of one process (small stacks), each with its own TCPStore client
connection to one TCPStore server: connect, publish an address, read both ring
neighbours' addresses, then a counter barrier (add, the last arrival sets a key everyone
waits for). The store's calls release the GIL, so the threads wait in the server as
separate processes would. Prints one JSON line: ranks, rendezvous_s (from the first
connect until every rank has read its neighbours), barrier_s (from then until every rank
has left the barrier).
"""
import argparse
import json
import resource
import threading
import time
from datetime import timedelta

import torch.distributed as dist


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--ranks", type=int, required=True)
    parser.add_argument("--timeout", type=float, default=600)
    args = parser.parse_args()
    n = args.ranks
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    threading.stack_size(256 << 10)
    timeout = timedelta(seconds=args.timeout)
    server = dist.TCPStore("127.0.0.1", 0, None, True, timeout, wait_for_workers=False)
    port = server.port
    start = threading.Barrier(n + 1)
    done_rdv = [0.0] * n
    done_bar = [0.0] * n
    began = [0.0] * n
    errors = []

    def rank(r):
        try:
            start.wait()
            began[r] = time.monotonic()
            store = dist.TCPStore("127.0.0.1", port, None, False, timeout)
            store.set("addr/%d" % r, "127.0.0.1:%d" % (20000 + r))
            store.get("addr/%d" % ((r - 1) % n))
            store.get("addr/%d" % ((r + 1) % n))
            done_rdv[r] = time.monotonic()
            if store.add("arrived", 1) == n:
                store.set("open", "1")
            store.wait(["open"])
            done_bar[r] = time.monotonic()
        except Exception as e:  # noqa: BLE001 - reported below
            errors.append("rank %d: %s" % (r, e))
            start.abort()

    threads = [threading.Thread(target=rank, args=(r,)) for r in range(n)]
    for t in threads:
        t.start()
    start.wait()
    for t in threads:
        t.join()
    if errors:
        raise SystemExit("torch TCPStore: " + errors[0])
    first = min(began)
    print(json.dumps({"who": "torch-tcpstore", "ranks": n,
                      "rendezvous_s": max(done_rdv) - first,
                      "barrier_s": max(done_bar) - max(done_rdv)}))


if __name__ == "__main__":
    main()
