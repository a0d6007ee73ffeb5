#!/bin/bash
# Interleaved rounds of kv's 1 MiB pull over shared memory at 1x1 into one
# buffer (--window 1) and into eight (--window 8, kv's default), each run
# with its own memcpy floors; rows go to OUT/w{1,8}-r{N}.json.
# Usage: pulls.sh BUILD OUT ROUNDS
set -eu
B=$1; OUT=$2; R=$3
mkdir -p "$OUT"
for r in $(seq 1 "$R"); do
    for w in 1 8; do
        "$B/ps-microbench" kv --sizes 1MiB --window "$w" --seconds 2 \
            --data-path shm --json > "$OUT/w$w-r$r.json" 2>/dev/null
    done
done
