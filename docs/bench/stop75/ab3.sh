#!/bin/bash
# Interleaved rounds of kv 1 MiB and 16 MiB over shm (push and pull rows) for
# three builds. Usage: ab3.sh OUT ROUNDS SHAPE BUILD...
set -u
OUT=$1; R=$2; SH=$3; shift 3
mkdir -p "$OUT"
for r in $(seq 1 "$R"); do
  for B in "$@"; do
    n=$(basename "$B")
    "$B/ps-microbench" kv --servers ${SH%x*} --workers ${SH#*x} --sizes 1MiB,16MiB --seconds 2 \
        --data-path shm --sgd-floor --json > "$OUT/$n-$SH-r$r.json" 2>/dev/null
  done
done
