#!/bin/bash
# sweep spin/yield knobs at 2x2 4KiB shm. Usage: sweep.sh OUT "spin:yield ..." ROUNDS
OUT=$1; SET=$2; N=$3; mkdir -p $OUT
for r in $(seq 1 $N); do
 for k in $SET; do
  sp=${k%:*}; y=${k#*:}
  PS_SCRATCH_SPIN_US=$sp PS_SCRATCH_YIELD_US=$y /tmp/scr-bin/ps-microbench kv --servers 2 --workers 2 --sizes 4KiB --seconds 2 --data-path shm --json > $OUT/s$sp-y$y-r$r.json 2>/dev/null
 done
done
