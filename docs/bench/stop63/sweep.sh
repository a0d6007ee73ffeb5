#!/bin/bash
# Rounds of the scratch build (scratch-ring.patch, binaries in /tmp/scr-bin), one kv run
# over shared memory for each spin:yield pair (microseconds) in each round.
# Usage: sweep.sh OUT SHAPE(SxW) SIZES "spin:yield ..." ROUNDS [more kv flags]
OUT=$1; SH=$2; SZ=$3; SET=$4; N=$5; shift 5; mkdir -p $OUT
for r in $(seq 1 $N); do
 for k in $SET; do
  sp=${k%:*}; y=${k#*:}
  PS_SCRATCH_SPIN_US=$sp PS_SCRATCH_YIELD_US=$y /tmp/scr-bin/ps-microbench kv --servers ${SH%x*} --workers ${SH#*x} \
    --sizes $SZ --seconds 2 --data-path shm --json "$@" > $OUT/s$sp-y$y-r$r.json 2>/dev/null
 done
done
