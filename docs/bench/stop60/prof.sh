#!/bin/bash
# perf -a over kv 4 KiB 2x2 shm OP throughput phase. Usage: prof.sh BUILD OP OUT
set -u
B=$1; OP=$2; OUT=$3
$B/ps-microbench kv --servers 2 --workers 2 --sizes 4KiB --seconds 4 --data-path shm --json > $OUT.json 2>/dev/null &
kv=$!
until pgrep -f "kv-worker.*--op $OP" > /dev/null; do sleep 0.1; done
sleep 4.5
perf record -a -g -o $OUT.data -- sleep 3 2> /dev/null
wait $kv
