#!/bin/bash
# Runs CMD during the throughput phase of one kv run over shared memory, with
# $W (the worker's pid) and $S (a server's pid) set for it.
# Usage: during.sh BUILD SHAPE(SxW) SIZE OP OUT -- CMD...   (kv's rows go to OUT.json)
set -u
B=$1; SH=$2; SZ=$3; OP=$4; OUT=$5; shift 6
$B/ps-microbench kv --servers ${SH%x*} --workers ${SH#*x} --sizes $SZ --seconds 4 --data-path shm --json > $OUT.json 2>/dev/null &
kv=$!
until pgrep -f "kv-worker.*--op $OP" > /dev/null; do sleep 0.1; done
sleep 4.5   # the 4 s latency phase has passed
export W=$(pgrep -f "kv-worker.*--op $OP" | head -1) S=$(pgrep -f "ps-server" | head -1)
OUT=$OUT bash -c "$*"
wait $kv
