#!/bin/bash
OUT=$1; SET=$2; N=$3; SZ=$4; mkdir -p $OUT
for r in $(seq 1 $N); do
 for k in $SET; do
  sp=${k%:*}; y=${k#*:}
  PS_SCRATCH_SPIN_US=$sp PS_SCRATCH_YIELD_US=$y /tmp/scr-bin/ps-microbench kv --servers 1 --workers 1 --sizes $SZ --seconds 2 --data-path shm --sgd-floor --json > $OUT/s$sp-y$y-r$r.json 2>/dev/null
 done
done
