#!/bin/bash
# The digits run ps-local makes (2 servers, 2 workers, batch 32, --hidden 64,
# Adam, lr 0.005), as four processes on this host: two ps-server and two
# ps-worker, each worker's JSON summary in OUT-w0.json and OUT-w1.json.
# SRV_ENV (for example PS_RUNTIME_THREADS=2) is passed to the servers.
# Usage: procs.sh BUILD_DIR grpc|shm EPOCHS OUT
set -u
B=$1; P=$2; E=$3; OUT=$4
for port in 7391 7392; do
  if ss -ltn | grep -q "127.0.0.1:$port "; then echo "port $port is taken" >&2; exit 1; fi
done
env ${SRV_ENV:-X=1} $B/ps-server --listen 127.0.0.1:7391 --workers 2 --data-path $P >/dev/null 2>&1 & S1=$!
env ${SRV_ENV:-X=1} $B/ps-server --listen 127.0.0.1:7392 --workers 2 --data-path $P >/dev/null 2>&1 & S2=$!
until ss -ltn | grep -q "127.0.0.1:7391 " && ss -ltn | grep -q "127.0.0.1:7392 "; do sleep 0.05; done
for r in 0 1; do
  ${W_PREFIX:-} $B/ps-worker --server 127.0.0.1:7391,127.0.0.1:7392 --rank $r --workers 2 --json \
    --epochs $E --batch-size 32 --hidden 64 --optimizer adam --lr 0.005 \
    --data-path $P 2>/dev/null > "$OUT-w$r.json" & W[$r]=$!
done
wait ${W[0]} ${W[1]}
kill $S1 $S2; wait $S1 $S2 2>/dev/null
exit 0
