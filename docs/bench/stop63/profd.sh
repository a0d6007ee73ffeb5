#!/bin/bash
# dwarf call graphs of one server and one worker during the kv 4 KiB 2x2 shm OP phase
set -u
B=$1; OP=$2; OUT=$3
$B/ps-microbench kv --servers 2 --workers 2 --sizes 4KiB --seconds 4 --data-path shm --json > $OUT.json 2>/dev/null &
kv=$!
until pgrep -f "kv-worker.*--op $OP" > /dev/null; do sleep 0.1; done
sleep 4.5
S=$(pgrep -f "ps-server" | head -1); W=$(pgrep -f "kv-worker.*--op $OP" | head -1)
perf record --call-graph dwarf,16384 -F 2000 -p $S,$W -o $OUT.data -- sleep 1.5 2> /dev/null
wait $kv
