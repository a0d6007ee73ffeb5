#!/bin/bash
# The gain: the default (2 servers beside the 2 workers, 4 MiB parts, f32,
# pipelined) against the plan's choice, two rounds on each link.
ARGS="--dataset synthetic --synthetic-features 1024 --hidden 2048,2048 --synthetic-train 3200 --epochs 1 --batch-size 32"
TB=target/release/ps-testbed
for round in 1 2; do
for L in 500mbit 1gbit; do
  $TB run --json --colocate --hosts server=2,worker=2 --link $L --scheduler-arg=--partition-bytes=4MiB -- $ARGS > /tmp/gain/default-$L-$round.json 2>/tmp/gain/default-$L-$round.err
  $TB run --json --hosts server=2,worker=2 --link $L --plan docs/bench/gain-stop50/plan-file-$L.json -- $ARGS > /tmp/gain/plan-$L-$round.json 2>/tmp/gain/plan-$L-$round.err
done
done
for f in /tmp/gain/*.json; do
  python3 -c "
import json
r=json.loads(open('$f').read().strip().splitlines()[-1])
w=r['workers']
print('$f', round(sum(x['step_ms'] for x in w)/len(w),1), [(n,round(s,2)) for n,s in w[0]['split'] if s>0.005])
"
done
