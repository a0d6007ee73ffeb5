#!/bin/bash
# Profiles the ps-server and the worker during kv 1 MiB pull throughput phase.
BIN=$1; OUT=$2
$BIN/ps-microbench kv --sizes 1MiB --seconds 2 --data-path shm --json > $OUT.json 2> $OUT.err &
K=$!
until grep -q "shared memory" $OUT.err 2>/dev/null; do sleep 0.05; done
sleep 6.1
perf record -a -g -o $OUT.data -- sleep 1.8 2>/dev/null >/dev/null
wait $K
