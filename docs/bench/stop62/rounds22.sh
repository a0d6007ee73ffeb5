#!/bin/bash
set -u
NEW=$1; BASE=$2; OUT=$3; N=$4; SIZES=$5; T=$6
mkdir -p $OUT
s=${T%x*}; w=${T#*x}
for r in $(seq 1 $N); do
    for b in new base; do
      B=$NEW; [ $b = base ] && B=$BASE
      $B/ps-microbench kv --servers $s --workers $w --sizes $SIZES --seconds 2 \
        --data-path shm --json > $OUT/$b-$T-r$r.json 2>/dev/null
    done
done
