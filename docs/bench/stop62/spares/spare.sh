#!/bin/bash
# usage: spare.sh OUT N
out=$1; n=$2; mkdir -p $out
for r in $(seq 1 $n); do
  for b in nospare spare; do
    RUST_LOG=info /tmp/$b-bin/ps-local --data-path shm --json 2>$out/$b-shm-$r.log | tail -1 > $out/$b-shm-$r.json
  done
  RUST_LOG=info /tmp/spare-bin/ps-local --data-path grpc --json 2>$out/spare-grpc-$r.log | tail -1 > $out/spare-grpc-$r.json
done
