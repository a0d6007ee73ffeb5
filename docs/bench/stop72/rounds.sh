#!/bin/bash
# Interleaved rounds on one build: procs.sh over gRPC and shared memory, and
# ps-local over each, all at EPOCHS (300 by default), into OUT.
# Usage: rounds.sh BUILD_DIR OUT ROUNDS [EPOCHS]
set -u
B=$1; OUT=$2; N=$3; E=${4:-300}; HERE=$(dirname "$0")
mkdir -p "$OUT"
for r in $(seq 1 $N); do
  for p in grpc shm; do
    "$HERE/procs.sh" "$B" $p $E "$OUT/procs-$p-r$r"
    "$B/ps-local" --json --epochs $E --data-path $p 2>/dev/null | tail -1 > "$OUT/local-$p-r$r.json"
  done
done
