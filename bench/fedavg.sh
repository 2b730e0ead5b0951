#!/bin/sh
# Federated learning on Fashion-MNIST (McMahan et al. 2017's headline), kolo against the
# FedAvg simulation in PyTorch (bench/peers/torch_fedavg.py) in one invocation: the mlp,
# 100 clients, 10 a round, FedAvg (E 5, B 10, lr 0.05) and FedSGD (E 1, B = the client's
# whole data, lr 0.1), on the pathological non-IID split (shards:2) and on IID. Prints the
# first round that reaches 0.70 / 0.75 / 0.80 test accuracy for each, and the ratio of rounds
# FedSGD / FedAvg. kolo runs as kolo run -n 3: the server and 2 client hosts of 50 clients.
# Then (SECTIONS): "secure": the cost of --secure-agg per round for K = 10, 50, 100 (time
# and bytes per client, against the same round without it); "dp": DP-FedAvg's accuracy and
# epsilon (delta 1e-5) for noise multipliers 0.3 to 4, 1000 clients, 100 a round, against
# clipping alone (sigma 0) and plain FedAvg (none).
# Usage: bench/fedavg.sh [BUILD_DIR]   (default build/release)
#   PARTITIONS="shards:2 iid"  FEDAVG_ROUNDS=60  FEDSGD_ROUNDS=200  PEER=1
#   SECTIONS="headline secure dp"  OUT=DIR (metrics files; default a temporary directory)
set -eu
here=$(cd "$(dirname "$0")" && pwd)
build=${1:-"$here/../build/release"}
kolo="$build/src/cli/kolo"
[ -x "$kolo" ] || { echo "fedavg: $kolo not built" >&2; exit 1; }
partitions=${PARTITIONS:-"shards:2 iid"}
fedavg_rounds=${FEDAVG_ROUNDS:-60}
fedsgd_rounds=${FEDSGD_ROUNDS:-200}
sections=${SECTIONS:-"headline secure dp"}
out=${OUT:-$(mktemp -d)}
mkdir -p "$out"
export OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1 MKL_NUM_THREADS=1

# First round at 0.70 / 0.75 / 0.80 and the best accuracy, from JSON lines with "round" and
# "test_accuracy".
rounds_to() {
  /usr/bin/python3 -c '
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if l.startswith("{\"round\"")]
firsts = []
for t in (0.70, 0.75, 0.80):
    hit = [r["round"] for r in rows if r["test_accuracy"] >= t]
    firsts.append(str(hit[0]) if hit else "-")
best = max((r["test_accuracy"] for r in rows), default=0)
print(" ".join(firsts), "%.4f" % best, len(rows))' "$1"
}

kolo_fed() {  # NAME ARGS...: a federated job of 3 processes, metrics in $out/NAME.jsonl
  name=$1
  shift
  start=$(date +%s)
  "$kolo" run -n 3 -- "$kolo" train --strategy federated --model mlp --threads 1 --quiet \
    --metrics "$out/$name.jsonl" "$@" > "$out/$name.log" 2>&1 || { cat "$out/$name.log" >&2; exit 1; }
  echo "$name: $(($(date +%s) - start)) s" >&2
}

if echo "$sections" | grep -q headline; then
  table=""
  for partition in $partitions; do
    kolo_fed "fedavg-$partition" --partition "$partition" --clients 100 --clients-per-round 10 \
      --local-epochs 5 --local-batch 10 --lr 0.05 --rounds "$fedavg_rounds"
    kolo_fed "fedsgd-$partition" --partition "$partition" --clients 100 --clients-per-round 10 \
      --local-epochs 1 --local-batch 0 --lr 0.1 --rounds "$fedsgd_rounds"
    table="$table
kolo $partition FedAvg $(rounds_to "$out/fedavg-$partition.jsonl")
kolo $partition FedSGD $(rounds_to "$out/fedsgd-$partition.jsonl")"
    if [ "${PEER:-1}" = 1 ]; then
      start=$(date +%s)
      /usr/bin/python3 "$here/peers/torch_fedavg.py" --partition "$partition" --local-epochs 5 \
        --local-batch 10 --lr 0.05 --rounds "$fedavg_rounds" > "$out/torch-fedavg-$partition.jsonl"
      /usr/bin/python3 "$here/peers/torch_fedavg.py" --partition "$partition" --local-epochs 1 \
        --local-batch 0 --lr 0.1 --rounds "$fedsgd_rounds" > "$out/torch-fedsgd-$partition.jsonl"
      echo "torch $partition: $(($(date +%s) - start)) s" >&2
      table="$table
PyTorch $partition FedAvg $(rounds_to "$out/torch-fedavg-$partition.jsonl")
PyTorch $partition FedSGD $(rounds_to "$out/torch-fedsgd-$partition.jsonl")"
    fi
  done
  echo
  echo "rounds to reach a test accuracy (mlp, 100 clients, K 10; FedAvg E 5 B 10, FedSGD E 1 B all)"
  echo "$table" | awk 'NF == 8 {
      printf "%-8s %-9s %-7s 0.70 @ %4s  0.75 @ %4s  0.80 @ %4s  best %s of %s rounds\n",
             $1, $2, $3, $4, $5, $6, $7, $8
      key = $1 " " $2
      if ($3 == "FedAvg") avg[key] = $6; else sgd[key] = $6
    }
    END {
      for (k in avg) {
        if (avg[k] == "-") continue
        if (sgd[k] == "-") printf "%s: FedSGD did not reach 0.80; FedAvg did at round %s\n", k, avg[k]
        else printf "%s: FedSGD / FedAvg rounds to 0.80 = %.1fx\n", k, sgd[k] / avg[k]
      }
    }'
fi

if echo "$sections" | grep -q secure; then
  echo
  echo "secure aggregation: one round, K clients of 100 samples each, E 1 B 0 (mlp, 535,818 values)"
  printf "%5s %12s %12s %16s %16s\n" K plain_s secure_s "up B/client pl" "up B/client sa"
  for k in 10 50 100; do
    for mode in plain secure; do
      flag=""
      [ "$mode" = secure ] && flag=--secure-agg
      kolo_fed "cost-$mode-$k" --partition iid --train-limit $((k * 100)) --clients "$k" \
        --clients-per-round "$k" --local-epochs 1 --local-batch 0 --lr 0.1 --rounds 1 \
        --round-timeout 900 $flag
    done
    /usr/bin/python3 -c '
import json, sys
k = int(sys.argv[1])
def last(name):
    rows = [json.loads(l) for l in open(sys.argv[2] + "/cost-" + name + ".jsonl")]
    return rows[-1]
p, s = last("plain-%d" % k), last("secure-%d" % k)
print("%5d %12.2f %12.2f %16d %16d" % (k, p["round_s"], s["round_s"], p["bytes_up"] // k, s["bytes_up"] // k))' "$k" "$out"
  done
fi

if echo "$sections" | grep -q dp; then
  echo
  echo "DP-FedAvg: 1000 IID clients, 100 a round (q 0.1), E 1 B 20 lr 0.1, clip 0.3, 40 rounds, delta 1e-5"
  echo "(sigma none: plain FedAvg, no clipping; 0: clipping alone)"
  printf "%8s %10s %14s\n" sigma epsilon test_accuracy
  for sigma in none 0 0.3 0.7 1.5 4; do
    dp="--dp-clip 0.3 --dp-noise $sigma"
    [ "$sigma" = none ] && dp=""  # plain FedAvg: no clipping, weighted by sample counts
    kolo_fed "dp-$sigma" --partition iid --clients 1000 --clients-per-round 100 --local-epochs 1 \
      --local-batch 20 --lr 0.1 --rounds 40 $dp
    /usr/bin/python3 -c '
import json, sys
rows = [json.loads(l) for l in open(sys.argv[2])]
eps = rows[-1].get("epsilon", "-")
print("%8s %10s %14.4f" % (sys.argv[1], "inf" if eps is None else eps if eps == "-" else "%.2f" % eps,
                            rows[-1]["test_accuracy"]))' "$sigma" "$out/dp-$sigma.jsonl"
  done
fi
echo "metrics: $out" >&2
