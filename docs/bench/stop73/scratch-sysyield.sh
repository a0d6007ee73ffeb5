#!/bin/bash
# local-ab.sh OUT ROUNDS: ps-local --epochs 300 over shm and grpc, with and without PS_SCRATCH_NO_SYSYIELD.
out=$1; rounds=$2; mkdir -p $out
for r in $(seq 1 $rounds); do
  for v in base noyield; do
    for p in shm grpc; do
      if [ $v = noyield ]; then export PS_SCRATCH_NO_SYSYIELD=1; else unset PS_SCRATCH_NO_SYSYIELD; fi
      target/release/ps-local --data-path $p --epochs 300 --json 2>/dev/null | tail -1 > $out/$v-$p-r$r.json
    done
  done
done
unset PS_SCRATCH_NO_SYSYIELD
