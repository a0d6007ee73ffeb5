#!/bin/bash
# kv 4 KiB at 2x2 (and 4 KiB, 1 MiB at 1x1), gRPC and shared memory, with
# the floors, builds interleaved, three rounds:
# r{round}-{shape}-{build}.json. Usage: kv.sh BUILD... (folders holding
# ps-microbench and ps-server).
set -u
BUILDS="$*"
for round in 1 2 3; do
  for shape in "2 2 4KiB" "1 1 4KiB,1MiB"; do
    set -- $shape
    for b in $BUILDS; do
      $b/ps-microbench kv --servers $1 --workers $2 --sizes $3 --seconds 2 \
        --data-path grpc,shm --sgd-floor --json > r$round-${1}x$2-$(basename $b).json 2>/dev/null
    done
  done
done
