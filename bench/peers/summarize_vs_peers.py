#!/usr/bin/env python3
"""Table of kolo's allreduce against its peers from the JSON lines that
bench/allreduce_vs_peers.sh collected: per (np, size) the median time and busbw of kolo,
Open MPI and gloo, kolo's busbw over each peer's, and the memcpy bound.

Usage: summarize_vs_peers.py RESULTS.jsonl
The memcpy bound for a 2-rank allreduce of S bytes is t = 2 S / memcpy_bw (one core's
glibc memcpy of 64 MiB), i.e. busbw <= memcpy_bw / 2; it is not shown for more ranks than
cores. The goals (issue 3): at 64 MiB kolo's busbw >= 2x Open MPI's and >= 3x gloo's; at
4 KiB kolo's time <= Open MPI's.
"""
import json
import os
import sys


def label(nbytes):
    for unit, shift in (("GiB", 30), ("MiB", 20), ("KiB", 10)):
        if nbytes >= 1 << shift and nbytes % (1 << shift) == 0:
            return f"{nbytes >> shift} {unit}"
    return f"{nbytes} B"


def middle(records):
    """The run with the median busbw when several rounds measured the same point."""
    if not records:
        return None
    ordered = sorted(records, key=lambda rec: rec["busbw_GBps"])
    return ordered[len(ordered) // 2]


def main():
    rows = {}
    memcpy = None
    with open(sys.argv[1]) as f:
        for line in f:
            line = line.strip()
            if not line.startswith("{"):
                continue
            rec = json.loads(line)
            bench = rec.get("bench", "")
            if bench == "memcpy_bw":
                memcpy = rec["payload_GBps"]
                continue
            impl = {"kolo_allreduce": "kolo", "mpi_allreduce": "mpi", "torch_allreduce": "gloo"}.get(bench)
            if impl:
                rows.setdefault((rec["np"], rec["bytes"]), {}).setdefault(impl, []).append(rec)
    cores = os.cpu_count() or 1

    def cell(rec, key, fmt):
        return fmt.format(rec[key]) if rec else "-"

    def ratio(a, b):
        if not a or not b or not b["busbw_GBps"]:
            return "-"
        return "{:.2f}x".format(a["busbw_GBps"] / b["busbw_GBps"])

    print(f"memcpy (1 core, 64 MiB): {memcpy:.2f} GB/s" if memcpy else "memcpy: not measured")
    print()
    print("| np | size | kolo t (us) | kolo busbw | MPI t (us) | MPI busbw | kolo/MPI busbw "
          "| gloo t (us) | gloo busbw | kolo/gloo busbw | memcpy bound t (us) | bound busbw | kolo/bound | correct |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    for (np_, nbytes) in sorted(rows):
        r = rows[(np_, nbytes)]
        kolo, mpi, gloo = (middle(r.get(name)) for name in ("kolo", "mpi", "gloo"))
        bound_t = bound_bw = share = "-"
        if memcpy and np_ == 2 and np_ <= cores:
            t = 2 * nbytes / (memcpy * 1e9)
            bound_t = "{:.1f}".format(t * 1e6)
            bound_bw = "{:.3f}".format(memcpy / 2)
            if kolo:
                share = "{:.0%}".format(kolo["busbw_GBps"] / (memcpy / 2))
        correct = all(x["correct"] for x in (kolo, mpi, gloo) if x)
        print(f"| {np_} | {label(nbytes)} | {cell(kolo, 't_median_us', '{:.1f}')} | {cell(kolo, 'busbw_GBps', '{:.3f}')} "
              f"| {cell(mpi, 't_median_us', '{:.1f}')} | {cell(mpi, 'busbw_GBps', '{:.3f}')} | {ratio(kolo, mpi)} "
              f"| {cell(gloo, 't_median_us', '{:.1f}')} | {cell(gloo, 'busbw_GBps', '{:.3f}')} | {ratio(kolo, gloo)} "
              f"| {bound_t} | {bound_bw} | {share} | {'yes' if correct else 'NO'} |")


if __name__ == "__main__":
    main()
