#!/usr/bin/env bash
# An elastic job that a second host joins while it trains (two network namespaces joined
# through a bridge): `kolo run --elastic --nnodes 1:2` on host 1 (node 0, hosting the store)
# starts the job with 2 ranks; once they have completed a step, node 1 starts on host 2 and
# its 2 ranks join at a step boundary (the members wait for them before step 6). The job must
# end with 4 ranks, the joined ones named in the metrics, every sample of each epoch used
# once, and the weights of one device fed the same global batches (relative 1e-5).
# Exit 77 (ctest SKIP) with a message where namespaces are forbidden or the data is missing.
# Usage: netns_elastic_test.sh KOLO_BINARY
set -u
kolo="$1"
here="$(cd "$(dirname "$0")" && pwd)"
# shellcheck source=../comm_multihost/netns_hosts.sh
. "$here/../comm_multihost/netns_hosts.sh"

netns_test_begin "multi-host elastic test" fashion-mnist
store="$NETNS_ADDR1:29500"
# 120 samples, global batch 12: 10 steps an epoch; 25 steps.
train=(train --model mlp --batch 12 --optimizer sgd --momentum 0.9 --lr 0.05 --quiet --seed 3
  --train-limit 120 --steps 25)

fail() {
  echo "FAIL: $*"
  for f in "$dir"/node*.out "$dir"/node*.err; do
    [ -e "$f" ] && { echo "--- $f"; cat "$f"; }
  done
  exit 1
}

"$kolo" "${train[@]}" --save "$dir/one.safetensors" >"$dir/one.out" 2>&1 ||
  fail "the one-device reference run failed: $(cat "$dir/one.out")"

# node NODE NS: one launcher of the job in namespace NS, in the background.
node() {
  ip netns exec "$2" env KOLO_TOKEN=netns-elastic timeout 300 "$kolo" run --elastic \
    --nnodes 1:2 --node-rank "$1" -n 2 --store "$store" --timeout 20 -- "$kolo" "${train[@]}" \
    --strategy multi-worker-mirrored --debug-await-join 6 --debug-sample-log "$dir/samples" \
    --metrics "$dir/metrics.jsonl" --save "$dir/elastic.safetensors" \
    >"$dir/node$1.out" 2>"$dir/node$1.err" &
  pids+=($!)
}

node 0 "$NETNS_H1"
# Node 1 starts once the job runs: rank 0 has completed a step (its sample log has a line
# after its pid). Readiness, with a deadline.
lines() { if [ -e "$1" ]; then wc -l <"$1"; else echo 0; fi; }
for _ in $(seq 1 1200); do
  [ "$(lines "$dir/samples.rank-0")" -ge 2 ] && break
  kill -0 "${pids[0]}" 2>/dev/null || break
  sleep 0.1
done
[ "$(lines "$dir/samples.rank-0")" -ge 2 ] || fail "node 0's ranks did not complete a step"
node 1 "$NETNS_H2"

rc=0
for pid in "${pids[@]}"; do wait "$pid" || rc=1; done
pids=()
[ $rc -eq 0 ] || fail "a launcher failed"
grep -q "node 1 joins the running elastic job with 2 rank(s)" "$dir/node1.err" ||
  fail "node 1 did not say that it joins"

python3 - "$dir" <<'EOF' || fail "the run does not check out"
import array, collections, json, os, struct, sys
d = sys.argv[1]

# The metrics: ranks 2 and 3 (node 1) joined; the run ended with 4 ranks.
joined, final = set(), None
for line in open(os.path.join(d, "metrics.jsonl")):
    r = json.loads(line)
    if r.get("event") == "joined":
        joined |= {int(x) for x in r["joined"].split(",")}
        assert r["step"] >= 1, r  # after the job ran a step: mid-epoch
    if r.get("final"):
        final = r
assert joined == {2, 3}, joined
assert final and final["world_size"] == 4, final

# Every step's global batch complete in the newest generation that completed it, and every
# sample of each epoch used once; each rank one process, every rank to the last step.
steps = {}
for rank in range(4):
    lines = open(os.path.join(d, "samples.rank-%d" % rank)).read().split("\n")
    assert sum(l.startswith("pid ") for l in lines) == 1, rank
    last = -1
    for l in lines:
        if not l or l.startswith("pid "):
            continue
        g, step, *ids = map(int, l.split())
        last = max(last, step)
        have = steps.get(step)
        if have is None or g > have[0]:
            steps[step] = (g, list(ids))
        elif g == have[0]:
            have[1].extend(ids)
    assert last == 24, (rank, last)
assert sorted(steps) == list(range(25)), sorted(steps)
uses = collections.defaultdict(collections.Counter)
for step, (g, ids) in steps.items():
    assert len(ids) == 12, (step, ids)
    uses[step // 10].update(ids)
for epoch, c in uses.items():
    assert len(c) == (120 if epoch < 2 else 60) and set(c.values()) == {1}, (epoch, c)

# The weights: one device's, relative 1e-5.
def load(path):
    b = open(path, "rb").read()
    n = struct.unpack("<Q", b[:8])[0]
    header = json.loads(b[8:8 + n])
    out = {}
    for name, v in header.items():
        if name == "__metadata__":
            continue
        s, e = v["data_offsets"]
        out[name] = array.array("f", b[8 + n + s:8 + n + e])
    return out
one, got = load(os.path.join(d, "one.safetensors")), load(os.path.join(d, "elastic.safetensors"))
assert one.keys() == got.keys()
for name in one:
    diff = max(abs(a - b) for a, b in zip(one[name], got[name]))
    scale = max(abs(a) for a in one[name]) or 1.0
    assert diff / scale <= 1e-5, (name, diff / scale)
print("ok: ranks 2 and 3 joined; 4 ranks at the end; every sample once; one device's weights")
EOF
grep -h "membership changed\|joined rank" "$dir"/node*.err "$dir"/node*.out
exit 0
