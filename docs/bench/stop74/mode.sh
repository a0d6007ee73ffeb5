#!/bin/bash
# mode.sh OUT ROUNDS [ps-local args]: base build, and the scratch build under each PS_SCRATCH_MODE, interleaved, under perf stat
set -eu
out=$1; rounds=$2; shift 2; mkdir -p "$out"
for r in $(seq 1 "$rounds"); do
  for v in base selfwake sleep bells-selfwake; do
    PS_SCRATCH_MODE=$v perf stat -x, -e task-clock,syscalls:sys_enter_epoll_wait,syscalls:sys_enter_sched_yield,syscalls:sys_enter_futex,syscalls:sys_enter_write \
      -o "$out/$v-r$r.stat" /tmp/tnew/release/ps-local --data-path shm --epochs 300 --json "$@" 2>/dev/null | tail -1 > "$out/$v-r$r.json"
  done
done
