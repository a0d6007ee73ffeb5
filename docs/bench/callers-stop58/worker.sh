#!/bin/bash
# ps-worker on digits, one worker over shm, before and after, interleaved, each
# against its own build's ps-server: the time split's seconds over the run
# (1,320 steps) and the wall time. BEFORE and AFTER are folders of release
# programs.
BEFORE=${1:?before}; AFTER=${2:?after}
for round in 1 2 3 4 5; do
  for b in $BEFORE $AFTER; do
    $b/ps-server --listen 127.0.0.1:7391 --workers 1 --data-path shm >/dev/null 2>&1 &
    P=$!
    until ss -ltn | grep -q 127.0.0.1:7391; do sleep 0.05; done
    $b/ps-worker --server 127.0.0.1:7391 --json --epochs 30 --batch-size 32 --hidden 64 \
      --optimizer adam --lr 0.005 --data-path shm 2>/dev/null | python3 -c "
import json, sys
d = json.load(sys.stdin); t = d['time_split']
print('$round $(basename $b) compute %.3f push %.3f pull %.3f wall %.3f examples/s %.0f' % (
    t['compute']['seconds'], t['push']['seconds'], t['pull']['seconds'],
    d['wall_seconds'], d['examples_per_second']))"
    kill $P; wait $P 2>/dev/null
  done
done
