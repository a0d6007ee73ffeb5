#!/bin/bash
# The sweep of YIELD_CORE_AFTER (the spin's first microseconds in which a
# waiting side lets only its own runtime's tasks run) on a scratch build that
# read it from PS_SCRATCH_YIELD_US (shm/src/ring.rs, Turns::yield_core_after
# for Turns::Apart; not landed). Usage: yield-sweep.sh BUILD OUT SHAPE ROUND VALUES...
set -u
B=$1; OUT=$2; SH=$3; R=$4; shift 4
mkdir -p "$OUT"
for y in "$@"; do
  PS_SCRATCH_YIELD_US=$y "$B/ps-microbench" kv --servers ${SH%x*} --workers ${SH#*x} \
      --sizes 4KiB --seconds 2 --data-path shm --json > "$OUT/$SH-y$y-r$R.json" 2>/dev/null
done
