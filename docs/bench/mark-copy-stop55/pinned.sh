#!/bin/bash
# kv at 1 MiB with the ps-server pinned to cpu 0 and every other ps-microbench process to cpu 1.
BIN=$1; OUT=$2
$BIN/ps-microbench kv --sizes 1MiB --seconds 2 --data-path shm --sgd-floor --json > $OUT.json 2> $OUT.err &
K=$!
main=$K
until pgrep -x ps-server >/dev/null; do sleep 0.01; done
for t in $(ls /proc/$(pgrep -x ps-server)/task); do taskset -p -c 0 $t >/dev/null; done
while kill -0 $K 2>/dev/null; do
  for p in $(pgrep -x ps-microbench); do [ $p = $main ] && continue; for t in $(ls /proc/$p/task 2>/dev/null); do taskset -p -c 1 $t >/dev/null 2>&1; done; done
  for p in $(pgrep -x ps-server); do for t in $(ls /proc/$p/task 2>/dev/null); do taskset -p -c 0 $t >/dev/null 2>&1; done; done
  sleep 0.2
done
