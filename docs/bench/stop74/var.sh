#!/bin/bash
# var.sh OUT ROUNDS [ps-local args]: the new build under PS_SCRATCH_SLEEP=all|server|worker|none, and base
set -eu
out=$1; rounds=$2; shift 2; mkdir -p "$out"
for r in $(seq 1 "$rounds"); do
  for v in base all server worker none; do
    dir=/tmp/tnew; [ $v = base ] && dir=/tmp/tprof
    PS_SCRATCH_SLEEP=$v perf stat -x, -e task-clock,syscalls:sys_enter_epoll_wait,syscalls:sys_enter_sched_yield,syscalls:sys_enter_futex,syscalls:sys_enter_write \
      -o "$out/$v-r$r.stat" "$dir/release/ps-local" --data-path shm --epochs 300 --json "$@" 2>/dev/null | tail -1 > "$out/$v-r$r.json"
  done
done
