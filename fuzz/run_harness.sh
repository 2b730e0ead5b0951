#!/usr/bin/env bash
# Runs one libFuzzer harness over its seed corpus, then fuzzes for SECONDS more.
# New inputs go to a scratch corpus under WORKDIR, never into the seeds; a crash leaves
# its input in WORKDIR/<harness>/crash-* and makes this script (and its ctest) fail.
# Usage: run_harness.sh HARNESS_BINARY FUZZ_DIR WORKDIR SECONDS [libFuzzer flags...]
set -euo pipefail
binary=$1 fuzz_dir=$2 workdir=$3 seconds=$4
shift 4
name=$(basename "$binary")
run_dir="$workdir/$name"
rm -rf "$run_dir"
mkdir -p "$run_dir/corpus"
flags=(-max_total_time="$seconds" -timeout=10 -rss_limit_mb=2048 -print_final_stats=1
       -artifact_prefix="$run_dir/")
dict="$fuzz_dir/dict/${name%_fuzz}.dict"
[ -f "$dict" ] && flags+=(-dict="$dict")
exec "$binary" "${flags[@]}" "$@" "$run_dir/corpus" "$fuzz_dir/corpus/$name"
