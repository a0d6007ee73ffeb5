#!/bin/bash
# digits: single_process and data_parallel (one worker, shm) for base and new examples, interleaved; wall seconds.
for round in 1 2 3; do
  for t in 1 2; do
    for v in head; do
      s=$( { RAYON_NUM_THREADS=$t /usr/bin/time -f %e ${EXAMPLES:-target/release/examples}/single_process >/dev/null; } 2>&1 | tail -1)
      target/release/ps-server --listen 127.0.0.1:7391 --workers 1 --data-path shm >/dev/null 2>&1 & spid=$!
      sleep 0.5
      d=$( { RAYON_NUM_THREADS=$t /usr/bin/time -f %e ${EXAMPLES:-target/release/examples}/data_parallel 127.0.0.1:7391 >/dev/null; } 2>&1 | tail -1)
      kill $spid; wait $spid 2>/dev/null
      echo "round $round threads $t $v single $s dp_shm $d"
    done
  done
done
