#!/bin/bash
# perf over the throughput phase of kv 4 KiB pulls at 2x2 through shared
# memory: waits for the pull's kv-worker processes, lets their latency
# phase (4 s) pass, and records every CPU for 3 s of the throughput phase.
# Usage: prof.sh BUILD OUT (OUT.json, OUT.data and OUT.txt are written).
set -u
B=$1; OUT=$2
$B/ps-microbench kv --servers 2 --workers 2 --sizes 4KiB --seconds 4 \
  --data-path shm --json > $OUT.json 2>/dev/null &
kv=$!
until pgrep -f "kv-worker.*--op pull" > /dev/null; do sleep 0.2; done
sleep 4.5
perf record -a -g -o $OUT.data -- sleep 3 2> /dev/null
wait $kv
perf report -i $OUT.data --no-children --sort comm,dso,sym --stdio 2> /dev/null \
  | grep -v "^$" | grep -v "^#" | grep "%" | head -80 > $OUT.txt
