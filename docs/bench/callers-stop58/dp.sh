#!/bin/bash
# Digits, one worker: data_parallel over shm before (a reader task and a writer
# task between the loop and the rings) and after (each request writes and reads
# the rings itself), interleaved, each against its own build's ps-server; and
# the single process. BEFORE and AFTER are folders of release programs.
BEFORE=${1:?before}; AFTER=${2:?after}
for round in 1 2 3 4 5 6; do
  for b in $BEFORE $AFTER; do
    $b/ps-server --listen 127.0.0.1:7391 --workers 1 --data-path shm >/dev/null 2>&1 &
    P=$!
    until ss -ltn | grep -q 127.0.0.1:7391; do sleep 0.05; done
    dp=$( { /usr/bin/time -f %e $b/data_parallel 127.0.0.1:7391 >/dev/null; } 2>&1 | tail -1)
    kill $P; wait $P 2>/dev/null
    echo "$round $(basename $b) data_parallel $dp"
  done
  echo "$round single_process $( { /usr/bin/time -f %e $AFTER/single_process >/dev/null; } 2>&1 | tail -1)"
done
