#!/bin/bash
# usage: rounds.sh BIN OUTDIR N [extra ps-local args]
bin=$1; out=$2; n=$3; shift 3
mkdir -p $out
for r in $(seq 1 $n); do for p in grpc shm; do
  $bin/ps-local --data-path $p --json "$@" 2>/dev/null | tail -1 > $out/$p-$r.json
done; done
