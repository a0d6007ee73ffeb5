#!/bin/bash
# Link use by partition (and so pipelined group) size: 2 server hosts, 2 worker hosts.
cd /work/main
ARGS="--dataset synthetic --synthetic-features 1024 --hidden 2048,2048 --batch-size 32 --optimizer sgd --epochs 1 --synthetic-train 960"
for round in 1 2; do
  for rate in 200mbit 100mbit 1gbit; do
    for part in 1MiB 256KiB 128KiB; do
      echo "== round $round rate $rate partition $part"
      target/release/ps-testbed run --link $rate --scheduler-arg=--partition-bytes=$part -- $ARGS 2>&1 | grep -E "^(worker|server)[12] "
    done
  done
done
