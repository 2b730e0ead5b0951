"""Starts N ranks of a test script as separate processes with torch's launcher variables
(MASTER_ADDR, MASTER_PORT, RANK, WORLD_SIZE, LOCAL_RANK) and waits for all of them, with a
deadline; shared by the kolo_torch tests."""
import os
import socket
import subprocess
import sys
import time


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def launch(script, world, args=(), deadline_s=60, extra_env=None):
    """Runs `script --worker ARGS` as `world` ranks; returns [(returncode, output)] by rank."""
    port = free_port()
    procs = []
    for rank in range(world):
        env = dict(os.environ, MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank),
                   WORLD_SIZE=str(world), LOCAL_RANK=str(rank), LOCAL_WORLD_SIZE=str(world),
                   OMP_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1", GLOO_SOCKET_IFNAME="lo")
        for k in ("KOLO_RANK", "KOLO_WORLD_SIZE", "KOLO_STORE"):
            env.pop(k, None)
        env.update(extra_env or {})
        procs.append(subprocess.Popen([sys.executable, script, "--worker", *map(str, args)], env=env,
                                      stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True))
    end = time.monotonic() + deadline_s
    results = []
    for rank, p in enumerate(procs):
        try:
            out, _ = p.communicate(timeout=max(0.1, end - time.monotonic()))
        except subprocess.TimeoutExpired:
            for q in procs:
                q.kill()
            out, _ = p.communicate()
            out += f"\n[rank {rank} still running after {deadline_s} s: killed]"
            p.returncode = p.returncode if p.returncode is not None else -9
        results.append((p.returncode, out))
    return results


def require_all_ok(results, label):
    """Prints every rank's output; exits 1 when a rank failed."""
    ok = True
    for rank, (rc, out) in enumerate(results):
        print(f"---- {label}: rank {rank} exit {rc}\n{out.rstrip()}")
        ok = ok and rc == 0
    if not ok:
        print(f"FAIL: {label}")
        sys.exit(1)
