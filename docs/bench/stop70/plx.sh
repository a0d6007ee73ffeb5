#!/bin/bash
# More interleaved ps-local rounds of two builds (--epochs 300, each data path).
# Usage: plx.sh OUT ROUNDS BASE_DIR NEW_DIR   (files plx-base-* and plx-new1-*)
set -eu
OUT=$1; ROUNDS=$2; BASE=$3; NEW=$4
for r in $(seq 1 "$ROUNDS"); do
  for build in base new1; do
    dir=$BASE; [ $build = new1 ] && dir=$NEW
    for path in shm grpc; do
      "$dir/ps-local" --json --epochs 300 --data-path $path 2>/dev/null | tail -1 \
        > "$OUT/plx-$build-$path-r$r.json"
    done
  done
done
