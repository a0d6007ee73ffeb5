#!/bin/bash
# Profiles the ps-server and the worker during kv's 1 MiB push throughput phase,
# or, with AFTER (seconds after the shared-memory rows start; 2.1 by default),
# another phase: 6.1 is the pull throughput phase (../read-ahead-stop56).
BIN=$1; OUT=$2; AFTER=${3:-2.1}
$BIN/ps-microbench kv --sizes 1MiB --seconds 2 --data-path shm --json > $OUT.json 2> $OUT.err &
K=$!
until grep -q "shared memory" $OUT.err 2>/dev/null; do sleep 0.05; done
sleep $AFTER
perf record -a -g -o $OUT.data -- sleep 1.8 2>/dev/null >/dev/null
wait $K
