"""Every torch.distributed operation over backend "kolo", for every dtype, at one world
size (argument), against closed-form values: rank r contributes r + 1 (or bit r), so the sum
is n(n+1)/2, the product n!, and so on; then the ops gloo has, on the same random inputs,
against a gloo group in the same job. One process per rank runs every case."""
import datetime
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import ranks  # noqa: E402

FLOATS = ["float32", "float64", "float16", "bfloat16"]
INTS = ["int8", "int32", "int64", "uint8"]
ALL = FLOATS + INTS + ["bool"]


def worker():
    import math
    import threading
    import torch
    import torch.distributed as dist
    import kolo_torch  # noqa: F401

    dist.init_process_group("kolo", timeout=datetime.timedelta(seconds=30))
    r, n = dist.get_rank(), dist.get_world_size()
    R = dist.ReduceOp
    checks = 0

    def check(name, got, expected):
        nonlocal checks
        expected = expected.to(got.dtype) if isinstance(expected, torch.Tensor) else expected
        if not torch.equal(got, expected):
            raise AssertionError(f"rank {r}: {name}: got {got.tolist()[:8]}, expected {expected.tolist()[:8]}")
        checks += 1

    def mine(dtype, count, value):
        return torch.full((count,), value, dtype=dtype)

    for name in ALL:
        dt = getattr(torch, name)
        is_bool, is_int = name == "bool", name in INTS
        # all_reduce: every op the dtype has, counts 0, 1, 7 and 1000, one strided tensor.
        if is_bool:
            cases = {R.SUM: True, R.MAX: True, R.BOR: True, R.PRODUCT: n == 1, R.MIN: n == 1,
                     R.BAND: n == 1, R.BXOR: True}
            value = r == 0
        else:
            cases = {R.SUM: n * (n + 1) // 2, R.PRODUCT: math.factorial(n), R.MIN: 1, R.MAX: n}
            if not is_int:
                cases[R.AVG] = (n + 1) / 2
            value = r + 1
        for op, expected in cases.items():
            for count in (0, 1, 7, 1000):
                t = mine(dt, count, value)
                dist.all_reduce(t, op=op)
                check(f"all_reduce {op} {name} x{count}", t, torch.full((count,), expected, dtype=dt))
        if is_int:
            for op, expected in ((R.BAND, 1 if n == 1 else 0), (R.BOR, (1 << n) - 1), (R.BXOR, (1 << n) - 1)):
                t = mine(dt, 7, 1 << r)
                dist.all_reduce(t, op=op)
                check(f"all_reduce {op} {name}", t, torch.full((7,), expected, dtype=dt))
        strided = torch.full((6, 4), value, dtype=dt).t()  # not contiguous
        dist.all_reduce(strided, op=R.MAX)
        check(f"all_reduce strided {name}", strided, torch.full((4, 6), True if is_bool else n, dtype=dt))
        w = dist.all_reduce(mine(dt, 5, value), op=R.MAX, async_op=True)
        w.wait()
        fut_value = w.get_future().wait()[0]
        check(f"all_reduce async future {name}", fut_value, torch.full((5,), True if is_bool else n, dtype=dt))

        v = (lambda k: (k % 2 == 0)) if is_bool else (lambda k: k + 1)
        # broadcast from the last rank
        t = mine(dt, 9, v(r))
        dist.broadcast(t, src=n - 1)
        check(f"broadcast {name}", t, torch.full((9,), v(n - 1), dtype=dt))
        # all_gather and all_gather_into_tensor
        outs = [torch.zeros(3, dtype=dt) for _ in range(n)]
        dist.all_gather(outs, mine(dt, 3, v(r)))
        for k in range(n):
            check(f"all_gather {name} block {k}", outs[k], torch.full((3,), v(k), dtype=dt))
        flat = torch.zeros(n * 3, dtype=dt)
        dist.all_gather_into_tensor(flat, mine(dt, 3, v(r)))
        check(f"all_gather_into_tensor {name}", flat,
              torch.cat([torch.full((3,), v(k), dtype=dt) for k in range(n)]))
        # reduce_scatter (list) and reduce_scatter_tensor: block k of rank r holds v(r) + k
        if not is_bool:
            ins = [mine(dt, 4, r + 1 + k) for k in range(n)]
            out = torch.zeros(4, dtype=dt)
            dist.reduce_scatter(out, ins)
            check(f"reduce_scatter {name}", out, torch.full((4,), n * (n + 1) // 2 + n * r, dtype=dt))
            out = torch.zeros(4, dtype=dt)
            dist.reduce_scatter_tensor(out, torch.cat(ins))
            check(f"reduce_scatter_tensor {name}", out, torch.full((4,), n * (n + 1) // 2 + n * r, dtype=dt))
            out = torch.zeros(4, dtype=dt)
            dist.reduce_scatter_tensor(out, torch.cat(ins), op=R.MAX)
            check(f"reduce_scatter_tensor MAX {name}", out, torch.full((4,), n + r, dtype=dt))
            # reduce to rank 0
            t = mine(dt, 6, r + 1)
            dist.reduce(t, dst=0)
            if r == 0:
                check(f"reduce {name}", t, torch.full((6,), n * (n + 1) // 2, dtype=dt))
        # gather / scatter at the last rank
        root = n - 1
        gl = [torch.zeros(2, dtype=dt) for _ in range(n)] if r == root else None
        dist.gather(mine(dt, 2, v(r)), gl, dst=root)
        if r == root:
            for k in range(n):
                check(f"gather {name} block {k}", gl[k], torch.full((2,), v(k), dtype=dt))
        out = torch.zeros(5, dtype=dt)
        dist.scatter(out, [mine(dt, 5, v(k)) for k in range(n)] if r == root else None, src=root)
        check(f"scatter {name}", out, torch.full((5,), v(r), dtype=dt))
        # all_to_all_single, equal and uneven splits: rank r sends k+1 rows of value 10r+k to k
        if not is_bool:
            inp = torch.tensor([10 * r + k for k in range(n)], dtype=torch.int64).to(dt)
            out = torch.zeros(n, dtype=dt)
            dist.all_to_all_single(out, inp)
            check(f"all_to_all_single {name}", out, torch.tensor([10 * k + r for k in range(n)]).to(dt))
            inp = torch.cat([torch.full((k + 1, 2), 10 * r + k, dtype=dt) for k in range(n)])
            out = torch.zeros(n * (r + 1), 2, dtype=dt)
            dist.all_to_all_single(out, inp, output_split_sizes=[r + 1] * n,
                                   input_split_sizes=[k + 1 for k in range(n)])
            check(f"all_to_all_single uneven {name}", out,
                  torch.cat([torch.full((r + 1, 2), 10 * k + r, dtype=dt) for k in range(n)]))
            outs = [torch.zeros(k + 1, dtype=dt) for k in range(n)]
            dist.all_to_all(outs, [torch.full((r + 1,), 10 * r + k, dtype=dt) for k in range(n)])
            for k in range(n):
                check(f"all_to_all {name} block {k}", outs[k], torch.full((k + 1,), 10 * k + r, dtype=dt))
        # send/recv around the ring, posted before the matching send (isend/irecv)
        if n > 1:
            got = torch.zeros(3, dtype=dt)
            rq = dist.irecv(got, src=(r - 1) % n, tag=5)
            sq = dist.isend(mine(dt, 3, v(r)), dst=(r + 1) % n, tag=5)
            sq.wait()
            rq.wait()
            check(f"send/recv {name}", got, torch.full((3,), v((r - 1) % n), dtype=dt))

    # A recv posted ahead of a collective does not hold the collective back.
    if n > 1:
        got = torch.zeros(4)
        rq = dist.irecv(got, src=(r + 1) % n)
        t = torch.ones(4)
        dist.all_reduce(t)
        dist.send(torch.full((4,), float(r)), dst=(r - 1) % n)
        rq.wait()
        check("recv behind all_reduce", got, torch.full((4,), float((r + 1) % n)))
        check("all_reduce ahead of recv", t, torch.full((4,), float(n)))

    # recv without src: rank 0 takes every other rank's message in whatever order they come,
    # and each call returns its sender (Work._source_rank()).
    if n > 1:
        if r == 0:
            senders = set()
            for _ in range(n - 1):
                got = torch.zeros(5)
                sender = dist.recv(got, tag=9)
                senders.add(sender)
                check(f"recv from any rank: {sender}", got, torch.full((5,), float(sender)))
            if senders != set(range(1, n)):
                raise AssertionError(f"recv from any rank: senders {sorted(senders)}")
        else:
            dist.send(torch.full((5,), float(r)), dst=0, tag=9)

    # A sub-group (every even rank) alongside the default group.
    evens = list(range(0, n, 2))
    sub = dist.new_group(evens)
    if r in evens:
        t = torch.full((3,), float(r))
        dist.all_reduce(t, group=sub)
        check("new_group all_reduce", t, torch.full((3,), float(sum(evens))))
    t = torch.ones(2)
    dist.all_reduce(t)
    check("default group after new_group", t, torch.full((2,), float(n)))

    # Many asynchronous all-reduces complete in issue order with their own values.
    works = []
    for i in range(20):
        t = torch.full((64,), float(i))
        works.append((t, dist.all_reduce(t, async_op=True)))
    for i, (t, w) in enumerate(works):
        w.wait()
        check(f"async all_reduce #{i}", t, torch.full((64,), float(i * n)))
    # Parity with gloo: the same random float32 inputs through a gloo group beside the default
    # one give the same results (bit for bit where no sum is taken; sums within rounding,
    # their order being each backend's own).
    gloo = dist.new_group(backend="gloo")
    gen = torch.Generator().manual_seed(1234 + r)
    x = torch.randn(1000, generator=gen)

    # An operation nobody waits for runs anyway (the worker takes what no caller claims):
    # rank 0 blocks in a gloo collective that the others reach only after this all_reduce.
    t = torch.ones(4)
    if r == 0:
        w = dist.all_reduce(t, async_op=True)
        dist.all_reduce(torch.ones(1), group=gloo)
        w.wait()
    else:
        dist.all_reduce(t)
        dist.all_reduce(torch.ones(1), group=gloo)
    check("all_reduce nobody waits for", t, torch.full((4,), float(n)))
    # Waited on another thread than the one that issued it, and with a timeout.
    t = torch.ones(4)
    w = dist.all_reduce(t, async_op=True)
    waiter = threading.Thread(target=w.wait)
    waiter.start()
    waiter.join()
    check("all_reduce waited on another thread", t, torch.full((4,), float(n)))
    t = torch.ones(4)
    dist.all_reduce(t, async_op=True).wait(datetime.timedelta(seconds=30))
    check("all_reduce waited with a timeout", t, torch.full((4,), float(n)))

    def same(name, ours, theirs, exact):
        nonlocal checks
        if exact:
            ok = torch.equal(ours, theirs)
        else:
            ok = torch.allclose(ours, theirs, rtol=1e-5, atol=1e-6)
        if not ok:
            raise AssertionError(f"rank {r}: gloo parity, {name}: kolo {ours.tolist()[:4]}, gloo {theirs.tolist()[:4]}")
        checks += 1

    for op, exact in ((R.SUM, False), (R.MAX, True), (R.MIN, True), (R.PRODUCT, False)):
        ours, theirs = x.clone(), x.clone()
        dist.all_reduce(ours, op=op)
        dist.all_reduce(theirs, op=op, group=gloo)
        same(f"all_reduce {op}", ours, theirs, exact)
    ours, theirs = x.clone(), x.clone()
    dist.broadcast(ours, src=n - 1)
    dist.broadcast(theirs, src=n - 1, group=gloo)
    same("broadcast", ours, theirs, True)
    ours, theirs = [torch.empty(1000) for _ in range(n)], [torch.empty(1000) for _ in range(n)]
    dist.all_gather(ours, x)
    dist.all_gather(theirs, x, group=gloo)
    same("all_gather", torch.stack(ours), torch.stack(theirs), True)
    ours, theirs = x.clone(), x.clone()
    dist.reduce(ours, dst=0)
    dist.reduce(theirs, dst=0, group=gloo)
    if r == 0:
        same("reduce", ours, theirs, False)
    ours, theirs = torch.empty(n * 8), torch.empty(n * 8)
    dist.all_to_all_single(ours, x[: n * 8].clone())
    dist.all_to_all_single(theirs, x[: n * 8].clone(), group=gloo)
    same("all_to_all_single", ours, theirs, True)
    ours_list = [torch.empty(1000) for _ in range(n)] if r == 0 else None
    theirs_list = [torch.empty(1000) for _ in range(n)] if r == 0 else None
    dist.gather(x, ours_list, dst=0)
    dist.gather(x, theirs_list, dst=0, group=gloo)
    if r == 0:
        same("gather", torch.stack(ours_list), torch.stack(theirs_list), True)
    chunks = list(torch.randn(n, 16, generator=torch.Generator().manual_seed(99)).unbind()) if r == 0 else None
    ours, theirs = torch.empty(16), torch.empty(16)
    dist.scatter(ours, chunks, src=0)
    dist.scatter(theirs, chunks, src=0, group=gloo)
    same("scatter", ours, theirs, True)

    dist.barrier()
    dist.destroy_process_group()
    print(f"rank {r}: {checks} checks passed")


def main():
    world = int(sys.argv[1])
    results = ranks.launch(os.path.abspath(__file__), world, deadline_s=120)
    ranks.require_all_ok(results, f"ops at world size {world}")


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "--worker":
        worker()
    else:
        main()
