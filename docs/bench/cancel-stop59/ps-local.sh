#!/bin/bash
# ps-local on digits (2 servers, 2 workers in one process), shared memory
# against gRPC, interleaved, five rounds. Usage: ps-local.sh BUILD (a folder
# holding ps-local).
B=${1:?build}
for round in 1 2 3 4 5; do
  for path in shm grpc; do
    r=$($B/ps-local --data-path $path --json 2>/dev/null | tail -1 | python3 -c "
import json, sys
d = json.loads(sys.stdin.read())
print(round(d['examples_per_second']), round(d['wall_seconds'], 3), d.get('test_accuracy'))")
    echo "round $round $path $r"
  done
done
