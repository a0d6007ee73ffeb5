#!/bin/bash
# check b's model through shm: one ps-server, one CPU ps-worker; prints the worker's split per step.
conf="$1"
target/release/ps-server --listen 127.0.0.1:7391 --workers 1 >/dev/null 2>&1 &
spid=$!
sleep 1
env $conf ${WORKER:-target/release/ps-worker} --server 127.0.0.1:7391 --json --dataset synthetic --synthetic-features 1024 \
  --synthetic-classes 10 --synthetic-train 2048 --hidden 4096,4096 --batch-size 256 \
  --epochs 1 --optimizer sgd --data-path shm 2>/dev/null | tail -1 | python3 -c "
import json,sys; d=json.loads(sys.stdin.read()); ts=d['time_split']; steps=d['steps']
print({k:(round(v['seconds']*1000/steps,1) if isinstance(v,dict) and 'seconds' in v else v) for k,v in ts.items()}, 'wall', round(d['wall_seconds'],2))"
kill $spid; wait $spid 2>/dev/null
