#!/bin/bash
# The gain at 1 Gbit/s, four rounds (two runs of this script): the issue's default (2 servers
# beside the 2 workers, 4 MiB parts, f32, pipelined) against the plan's choice.
cd "$(dirname "$0")/../../.."
mkdir -p /tmp/gain
ARGS="--dataset synthetic --synthetic-features 1024 --hidden 2048,2048 --synthetic-train 3200 --epochs 1 --batch-size 32"
TB=target/release/ps-testbed
for round in 1 2; do
  $TB run --json --colocate --hosts server=2,worker=2 --link 1gbit --scheduler-arg=--partition-bytes=4MiB -- $ARGS > /tmp/gain/default-1gbit-$round.json 2>/tmp/gain/default-1gbit-$round.err
  $TB run --json --hosts server=2,worker=2 --link 1gbit --plan docs/bench/gain-stop52/plan-file-1gbit.json -- $ARGS > /tmp/gain/plan-1gbit-$round.json 2>/tmp/gain/plan-1gbit-$round.err
done
for f in /tmp/gain/*1gbit*.json; do
  python3 -c "
import json
r=json.loads(open('$f').read().strip().splitlines()[-1])
w=r['workers']
print('$f', round(sum(x['step_ms'] for x in w)/len(w),1), [(n,round(s,2)) for n,s in w[0]['split'] if s>0.005])
"
done
echo ALLDONE
