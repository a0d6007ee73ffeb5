#!/bin/bash
# ps-local on digits (2 servers, 2 workers), before (candle counts cores each product) and after (pinned), each data path; interleaved.
# BIN_base: a build of 91417ae (before), BIN_pin: this stop's build.
declare -A BIN=([base]=${BIN_base:-/tmp/bin-base} [pin]=${BIN_pin:-target/release})
for round in 1 2 3; do
  for bin in base pin; do
    for path in shm grpc; do
      r=$(env -u RAYON_NUM_THREADS ${BIN[$bin]}/ps-local --data-path $path --json 2>/dev/null | tail -1 | python3 -c "import json,sys; d=json.loads(sys.stdin.read()); print(round(d['examples_per_second']), round(d['wall_seconds'],3), d.get('test_accuracy'))")
      echo "round $round $bin $path $r"
    done
  done
done
