#!/bin/bash
# Interleaved rounds of two builds: kv's 4 KiB rows at 1x1 and 2x2 (gRPC and
# shared memory in one run) and ps-local's digits run at 300 epochs over each
# data path. Usage: ab.sh OUT ROUNDS BASE_DIR NEW_DIR [FIRST_ROUND]
# (rounds numbered from FIRST_ROUND, 1 by default; each DIR holds
# ps-microbench, ps-server, ps-worker and ps-local).
set -eu
source "$(dirname "$0")/rounds.sh"
OUT=$1; ROUNDS=$2; BASE=$3; NEW=$4; FIRST=${5:-1}
mkdir -p "$OUT"
for r in $(seq "$FIRST" $((FIRST + ROUNDS - 1))); do
  for build in base new; do
    dir=$BASE; [ $build = new ] && dir=$NEW
    for shape in 1 2; do
      "$dir/ps-microbench" kv --servers $shape --workers $shape --sizes 4KiB --seconds 2 \
        --data-path grpc,shm --json > "$OUT/kv-$build-${shape}x${shape}-r$r.json" 2>/dev/null
    done
    ps_local_round "$dir" $build $r "$OUT" pl
  done
done
