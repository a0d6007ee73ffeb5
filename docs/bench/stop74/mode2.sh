#!/bin/bash
# mode2.sh OUT ROUNDS [ps-local args]: the scratch build under PS_SCRATCH_MODE base, selfwake and bells-selfwake over shm, and over gRPC, interleaved, under perf stat
set -eu
out=$1; rounds=$2; shift 2; mkdir -p "$out"
for r in $(seq 1 "$rounds"); do
  for v in base selfwake bells-selfwake grpc; do
    path=shm; [ $v = grpc ] && path=grpc
    PS_SCRATCH_MODE=$v perf stat -x, -e task-clock,syscalls:sys_enter_epoll_wait,syscalls:sys_enter_sched_yield,syscalls:sys_enter_futex,syscalls:sys_enter_write \
      -o "$out/$v-r$r.stat" /tmp/tnew/release/ps-local --data-path $path --epochs 300 --json "$@" 2>/dev/null | tail -1 > "$out/$v-r$r.json"
  done
done
