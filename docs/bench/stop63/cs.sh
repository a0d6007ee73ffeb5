#!/bin/bash
# context switches and syscalls per op in the kv 4 KiB 2x2 shm throughput phase. Usage: cs.sh BUILD OP OUT
B=$1; OP=$2; OUT=$3
$B/ps-microbench kv --servers 2 --workers 2 --sizes 4KiB --seconds 4 --data-path shm --json > $OUT.json 2>/dev/null &
kv=$!
until pgrep -f "kv-worker.*--op $OP" > /dev/null; do sleep 0.1; done
sleep 4.5
perf stat -a -e context-switches,cpu-migrations,raw_syscalls:sys_enter -o $OUT.stat -- sleep 2 2>/dev/null
wait $kv
