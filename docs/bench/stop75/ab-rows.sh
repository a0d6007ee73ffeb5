#!/bin/bash
# Interleaved rounds of kv's pull rows over shared memory, base build then new
# build each round, at 1x1 and 2x2, windows 1 and 8, sizes 1 MiB and 16 MiB.
# Usage: ab-rows.sh BASE NEW OUT ROUNDS
set -u
BASE=$1; NEW=$2; OUT=$3; R=$4
mkdir -p "$OUT"
for r in $(seq 1 "$R"); do
  for SH in 1x1 2x2; do
    for b in base new; do
      B=$BASE; [ $b = new ] && B=$NEW
      for w in 1 8; do
        "$B/ps-microbench" kv --servers ${SH%x*} --workers ${SH#*x} --sizes 1MiB,16MiB --window "$w" \
            --seconds 2 --data-path shm --json > "$OUT/$b-$SH-w$w-r$r.json" 2>/dev/null
      done
    done
  done
done
