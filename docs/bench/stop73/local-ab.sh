#!/bin/bash
# local-ab.sh BASE NEW OUT ROUNDS: ps-local --epochs 300 over shm and gRPC,
# the BASE build's binary and the NEW one's interleaved, ROUNDS rounds.
set -eu
base=$1; new=$2; out=$3; rounds=$4; mkdir -p "$out"
for r in $(seq 1 "$rounds"); do
  for build in base new; do
    dir=$base; [ $build = new ] && dir=$new
    for path in shm grpc; do
      "$dir/ps-local" --data-path $path --epochs 300 --json 2>/dev/null | tail -1 > "$out/$build-$path-r$r.json"
    done
  done
done
