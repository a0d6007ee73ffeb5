#!/bin/bash
# Before (base = da57567) and after (new2 = lent pulls + answers handed straight to the request), interleaved.
cd /tmp/bench53
for r in 1 2; do for b in base new2; do
  /tmp/$b-bin/ps-microbench kv --sizes 4KiB,1MiB,16MiB --seconds 2 --data-path grpc,shm --sgd-floor --json > kv-1x1-$b-$r.json 2>/dev/null
done; done
for b in base new2; do
  /tmp/$b-bin/ps-microbench kv --servers 2 --workers 2 --sizes 4KiB,1MiB,16MiB --seconds 2 --data-path grpc,shm --sgd-floor --json > kv-2x2-$b-1.json 2>/dev/null
done
# Small-batch training: digits, one worker, against the single process.
for r in 1 2 3; do
  /usr/bin/time -f "single $r %e" /tmp/base-bin/single_process > /dev/null 2>> dp.txt
  for b in base new2; do
    /tmp/$b-bin/ps-server --listen 127.0.0.1:7391 --workers 1 --data-path shm > /dev/null 2>&1 &
    pid=$!
    /usr/bin/time -f "dp-$b $r %e" /tmp/$b-bin/data_parallel 127.0.0.1:7391 > /dev/null 2>> dp.txt
    kill $pid; wait $pid 2>/dev/null
  done
done
# A large model's step (check b's shape), one server, one worker, shared memory.
for r in 1 2; do for b in base new2; do for path in shm grpc; do
  /tmp/$b-bin/ps-server --listen 127.0.0.1:7392 --workers 1 > /dev/null 2>&1 &
  pid=$!
  /tmp/$b-bin/ps-worker --server 127.0.0.1:7392 --json --dataset synthetic --synthetic-features 1024 \
    --synthetic-classes 10 --synthetic-train 2048 --hidden 4096,4096 --batch-size 256 \
    --epochs 1 --optimizer sgd --data-path $path 2>/dev/null | tail -1 > step-$b-$path-$r.json
  kill $pid; wait $pid 2>/dev/null
done; done; done
echo finished > done.txt
