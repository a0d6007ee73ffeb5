#!/bin/bash
# kv at 1x1 and 2x2, gRPC and shm with the SGD floor, before and after,
# interleaved, two rounds: r{round}-{shape}-{build}.json.
BEFORE=${1:?before}; AFTER=${2:?after}
for round in 1 2; do
  for shape in "1 1" "2 2"; do
    set -- $shape
    for b in $BEFORE $AFTER; do
      $b/ps-microbench kv --servers $1 --workers $2 --sizes 4KiB,1MiB,16MiB --seconds 2 \
        --data-path grpc,shm --sgd-floor --json > r$round-${1}x$2-$(basename $b).json 2>/dev/null
    done
  done
done
