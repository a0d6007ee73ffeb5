#!/bin/bash
# Time to accuracy on digits widened to 4.3 M parameters, 500 Mbit/s: the default
# (2 servers beside the workers, 4 MiB parts, f32, pipelined) against the plan's choice.
ARGS="--hidden 2048,2048 --epochs 5"
TB=target/release/ps-testbed
for round in 1 2; do
  $TB run --json --colocate --hosts server=2,worker=2 --link 500mbit --scheduler-arg=--partition-bytes=4MiB -- $ARGS > /tmp/tta/default-$round.json 2>/tmp/tta/default-$round.err
  $TB run --json --hosts server=2,worker=2 --link 500mbit --plan docs/bench/gain-stop50/plan-file-digits.json -- $ARGS > /tmp/tta/plan-$round.json 2>/tmp/tta/plan-$round.err
done
for f in /tmp/tta/*.json; do
  python3 -c "
import json
r=json.loads(open('$f').read().strip().splitlines()[-1])
w=r['workers']
print('$f', 'step', [round(x['step_ms'],1) for x in w], 'train s', [round(x['training_seconds'],1) for x in w], 'acc', [x['test_accuracy'] for x in w], 'wall', round(r['seconds'],1))
"
done
