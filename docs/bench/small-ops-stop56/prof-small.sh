#!/bin/bash
# Profiles the ps-servers and workers during kv's 4 KiB push latency phase
# (one operation in flight per worker), at SERVERS x WORKERS.
BIN=$1; OUT=$2; SERVERS=${3:-2}; WORKERS=${4:-2}
$BIN/ps-microbench kv --servers $SERVERS --workers $WORKERS --sizes 4KiB --seconds 2 --data-path shm --json > $OUT.json 2> $OUT.err &
K=$!
until grep -q "shared memory" $OUT.err 2>/dev/null; do sleep 0.05; done
sleep 0.1
perf record -a -g -o $OUT.data -- sleep 1.8 2>/dev/null >/dev/null
wait $K
