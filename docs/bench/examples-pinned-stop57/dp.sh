#!/bin/bash
# interleaved: single_process and data_parallel (shm), before and after pinning threads
S=/tmp/bin-before/ps-server
for round in 1 2 3 4; do
  for b in before after; do
    sp=$( { /usr/bin/time -f %e /tmp/bin-$b/single_process >/dev/null; } 2>&1 | tail -1)
    $S --listen 127.0.0.1:7391 --workers 1 --data-path shm >/dev/null 2>&1 &
    P=$!
    until ss -ltn | grep -q 127.0.0.1:7391; do sleep 0.05; done
    dp=$( { /usr/bin/time -f %e /tmp/bin-$b/data_parallel 127.0.0.1:7391 >/dev/null; } 2>&1 | tail -1)
    kill $P; wait $P 2>/dev/null
    echo "$round $b single $sp data_parallel $dp"
  done
done
