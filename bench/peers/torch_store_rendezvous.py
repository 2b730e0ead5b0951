#!/usr/bin/python3
"""PyTorch 1.13's TCPStore doing what an init does, for bench/rendezvous.sh: N simulated
ranks as threads (small stacks) of client processes of at most --per-process ranks, each
with its own TCPStore client connection to one TCPStore server in the parent process:
connect, publish an address, read both ring neighbours' addresses, then a counter barrier (add, the last arrival sets a key everyone
waits for). The store's calls release the GIL, so the threads wait in the server as
separate processes would. Prints one JSON line: ranks, rendezvous_s (from the first
connect until every rank has read its neighbours), barrier_s (from then until every rank
has left the barrier).
"""
import argparse
import json
import os
import resource
import threading
import time
from datetime import timedelta

import torch.distributed as dist


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--ranks", type=int, required=True)
    parser.add_argument("--timeout", type=float, default=600)
    parser.add_argument("--per-process", type=int, default=1024)
    args = parser.parse_args()
    n = args.ranks
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    threading.stack_size(256 << 10)
    timeout = timedelta(seconds=args.timeout)
    server = dist.TCPStore("127.0.0.1", 0, None, True, timeout, wait_for_workers=False)
    port = server.port
    # The clients run in their own processes (at most --per-process threads each, forked
    # before any thread starts) so that the server's process holds only its own sockets,
    # as in a job; they start together on a pipe and report their times on another.
    per = max(1, args.per_process)
    groups = [list(range(g, min(n, g + per))) for g in range(0, n, per)]
    go_r, go_w = os.pipe()
    children = []
    for group in groups:
        out_r, out_w = os.pipe()
        pid = os.fork()
        if pid == 0:
            os.close(out_r)
            os.close(go_w)
            code = run_clients(group, n, port, timeout, go_r, out_w)
            os._exit(code)
        os.close(out_w)
        children.append((pid, out_r))
    os.close(go_r)
    time.sleep(0.5 + len(groups) * 0.2)  # every child has its threads at the gate
    os.write(go_w, b"g" * len(groups))
    began, done_rdv, done_bar, errors = [], [], [], []
    for pid, out_r in children:
        with os.fdopen(out_r) as f:
            report = json.loads(f.read() or '{"errors": ["a client process ended without a report"]}')
        os.waitpid(pid, 0)
        errors += report.get("errors", [])
        began += report.get("began", [])
        done_rdv += report.get("rdv", [])
        done_bar += report.get("bar", [])
    if errors:
        raise SystemExit("torch TCPStore: " + errors[0])
    first = min(began)
    print(json.dumps({"who": "torch-tcpstore", "ranks": n, "client_processes": len(groups),
                      "rendezvous_s": max(done_rdv) - first,
                      "barrier_s": max(done_bar) - max(done_rdv)}))


def run_clients(ranks, n, port, timeout, go_r, out_w):
    """One client process: a thread per rank, released when the parent writes a byte."""
    gate = threading.Event()
    began, done_rdv, done_bar, errors = [], [], [], []

    def rank(r):
        try:
            gate.wait()
            began.append(time.monotonic())
            store = dist.TCPStore("127.0.0.1", port, None, False, timeout)
            store.set("addr/%d" % r, "127.0.0.1:%d" % (20000 + r))
            store.get("addr/%d" % ((r - 1) % n))
            store.get("addr/%d" % ((r + 1) % n))
            done_rdv.append(time.monotonic())
            if store.add("arrived", 1) == n:
                store.set("open", "1")
            store.wait(["open"])
            done_bar.append(time.monotonic())
        except Exception as e:  # noqa: BLE001 - reported below
            errors.append("rank %d: %s" % (r, e))

    threads = [threading.Thread(target=rank, args=(r,)) for r in ranks]
    for t in threads:
        t.start()
    os.read(go_r, 1)
    gate.set()
    for t in threads:
        t.join()
    os.write(out_w, json.dumps({"began": began, "rdv": done_rdv, "bar": done_bar, "errors": errors}).encode())
    os.close(out_w)
    return 0


if __name__ == "__main__":
    main()
