#!/bin/bash
# stat.sh OUT ROUNDS [ps-local args]: base and new ps-local over shm under perf stat, interleaved
set -eu
out=$1; rounds=$2; shift 2; mkdir -p "$out"
for r in $(seq 1 "$rounds"); do
  for b in base new; do
    dir=/tmp/tprof; [ $b = new ] && dir=/tmp/tnew
    perf stat -x, -e task-clock,syscalls:sys_enter_epoll_wait,syscalls:sys_enter_sched_yield,syscalls:sys_enter_futex,syscalls:sys_enter_write \
      -o "$out/$b-r$r.stat" "$dir/release/ps-local" --data-path shm --epochs 300 --json "$@" 2>/dev/null | tail -1 > "$out/$b-r$r.json"
  done
done
