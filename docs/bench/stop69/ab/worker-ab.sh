#!/bin/bash
# One ps-worker (digits, 200 epochs, --out) against one ps-server, each build and data path, interleaved.
# usage: worker-ab.sh ROUNDS ; builds in /tmp/base and /tmp/new
port=17100
for r in $(seq 1 $1); do for b in base new; do for p in shm grpc; do
  port=$((port+1))
  /tmp/$b/ps-server --listen 127.0.0.1:$port --workers 1 > /dev/null 2>&1 &
  srv=$!
  until /tmp/$b/ps-server health --help >/dev/null 2>&1 && (exec 3<>/dev/tcp/127.0.0.1/$port) 2>/dev/null; do sleep 0.05; done
  rm -rf w-$b-$p-$r
  /tmp/$b/ps-worker --server 127.0.0.1:$port --data-path $p --epochs 200 --out w-$b-$p-$r > w-$b-$p-$r.log 2>&1
  kill $srv; wait $srv 2>/dev/null
done; done; done
