#!/usr/bin/env bash
# Issue 38's rows with the SGD floor, ROUNDS rounds of each shape, interleaved,
# numbered from FIRST_ROUND (1):
#   docs/bench/stop68/full.sh OUT [ROUNDS] [FIRST_ROUND]
# Runs target/release/ps-microbench (build it first: cargo build --release -p ps-microbench -p ps-server).
set -euo pipefail
out=${1:?an output folder}
rounds=${2:-3}
first=${3:-1}
mkdir -p "$out"
for round in $(seq "$first" $((first + rounds - 1))); do
    for shape in 1 2; do
        target/release/ps-microbench kv --servers "$shape" --workers "$shape" \
            --sizes 4KiB,1MiB,16MiB --seconds 2 --data-path grpc,shm --sgd-floor --json \
            > "$out/full-${shape}x${shape}-r$round.json"
        echo "round $round ${shape}x${shape} done"
    done
done
