#!/bin/bash
# final.sh BASE NEW OUT ROUNDS [ps-local args]: ps-local --epochs 300 over shm with the BASE and NEW builds, and over gRPC with NEW, interleaved, under perf stat
set -eu
base=$1; new=$2; out=$3; rounds=$4; shift 4; mkdir -p "$out"
for r in $(seq 1 "$rounds"); do
  for v in base new grpc; do
    dir=$new; path=shm
    [ $v = base ] && dir=$base
    [ $v = grpc ] && path=grpc
    perf stat -x, -e task-clock,syscalls:sys_enter_epoll_wait,syscalls:sys_enter_sched_yield,syscalls:sys_enter_futex,syscalls:sys_enter_write \
      -o "$out/$v-r$r.stat" "$dir/ps-local" --data-path $path --epochs 300 --json "$@" 2>/dev/null | tail -1 > "$out/$v-r$r.json"
  done
done
