#!/bin/bash
# Interleaved kv rounds of two builds, shm only.
# Usage: rounds.sh NEW_BIN BASE_BIN OUTDIR ROUNDS SIZES [SHAPES, default "1x1 2x2"]
set -u
NEW=$1; BASE=$2; OUT=$3; N=$4; SIZES=$5; SHAPES=${6:-1x1 2x2}
mkdir -p $OUT
for r in $(seq 1 $N); do
  for t in $SHAPES; do
    s=${t%x*}; w=${t#*x}
    for b in new base; do
      B=$NEW; [ $b = base ] && B=$BASE
      $B/ps-microbench kv --servers $s --workers $w --sizes $SIZES --seconds 2 \
        --data-path shm --json > $OUT/$b-$t-r$r.json 2>/dev/null
    done
  done
done
