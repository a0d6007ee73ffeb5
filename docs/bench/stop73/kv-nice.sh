#!/bin/bash
# kvnice.sh OUT ROUNDS: 4 KiB 2x2 kv over shm and gRPC, workers at nice 0 and 5.
out=$1; rounds=$2
for r in $(seq 1 $rounds); do
  for n in 0 5; do
    if [ $n = 0 ]; then unset KV_SCRATCH_NICE; else export KV_SCRATCH_NICE=$n; fi
    target/release/ps-microbench kv --servers 2 --workers 2 --sizes 4KiB --seconds 2 --data-path grpc,shm --json > $out/kv-n$n-r$r.json 2>$out/kv-n$n-r$r.err
  done
done
unset KV_SCRATCH_NICE
