#!/bin/bash
# Interleaved ps-local rounds of two builds, both data paths.
# usage: pslocal-ab.sh NEW_BIN BASE_BIN OUTDIR N [extra ps-local args]
new=$1; base=$2; out=$3; n=$4; shift 4
mkdir -p $out
for r in $(seq 1 $n); do for b in new base; do for p in grpc shm; do
  bin=$new; [ $b = base ] && bin=$base
  $bin/ps-local --data-path $p --json "$@" 2>/dev/null | tail -1 > $out/$b-$p-$r.json
done; done; done
