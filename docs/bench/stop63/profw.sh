#!/bin/bash
# dwarf call graph of the kv worker during the throughput phase. Usage: profw.sh BUILD OP SIZE SHAPE(SxW) OUT
set -u
B=$1; OP=$2; SZ=$3; SH=$4; OUT=$5
$B/ps-microbench kv --servers ${SH%x*} --workers ${SH#*x} --sizes $SZ --seconds 4 --data-path shm --json > $OUT.json 2>/dev/null &
kv=$!
until pgrep -f "kv-worker.*--op $OP" > /dev/null; do sleep 0.1; done
sleep 4.5
W=$(pgrep -f "kv-worker.*--op $OP" | head -1)
perf record --call-graph dwarf,16384 -F 4000 -p $W -o $OUT.data -- sleep 1.5 2> /dev/null
wait $kv
