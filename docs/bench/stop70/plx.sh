#!/bin/bash
# More interleaved ps-local rounds of two builds (--epochs 300, each data path).
# Usage: plx.sh OUT ROUNDS BASE_DIR NEW_DIR   (files plx-base-* and plx-new1-*)
set -eu
source "$(dirname "$0")/rounds.sh"
OUT=$1; ROUNDS=$2; BASE=$3; NEW=$4
for r in $(seq 1 "$ROUNDS"); do
  for build in base new1; do
    dir=$BASE; [ $build = new1 ] && dir=$NEW
    ps_local_round "$dir" $build $r "$OUT" plx
  done
done
