#!/bin/bash
# Interleaved kv rounds of two builds. Usage: rounds.sh NEW_BIN BASE_BIN OUTDIR ROUNDS
set -u
NEW=$1; BASE=$2; OUT=$3; N=$4
for r in $(seq 1 $N); do
  for t in 1x1 2x2; do
    s=${t%x*}; w=${t#*x}
    for b in new base; do
      B=$NEW; [ $b = base ] && B=$BASE
      $B/ps-microbench kv --servers $s --workers $w --sizes 4KiB,1MiB,16MiB --seconds 2 \
        --data-path grpc,shm --sgd-floor --json > $OUT/$b-$t-r$r.json 2>/dev/null
    done
  done
done
