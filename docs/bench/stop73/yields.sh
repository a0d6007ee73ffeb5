#!/bin/bash
# yields.sh BASE NEW OUT ROUNDS: ps-local --data-path shm --epochs 300 under
# `perf stat` counting sched_yield and epoll_wait calls, the two builds
# interleaved; each run's summary to OUT/BUILD-rR.json, its counts to .stat.
set -eu
base=$1; new=$2; out=$3; rounds=$4; mkdir -p "$out"
for r in $(seq 1 "$rounds"); do
  for build in base new; do
    dir=$base; [ $build = new ] && dir=$new
    perf stat -x, -o "$out/$build-r$r.stat" \
      -e syscalls:sys_enter_sched_yield,syscalls:sys_enter_epoll_wait,task-clock \
      "$dir/ps-local" --data-path shm --epochs 300 --json 2>/dev/null | tail -1 > "$out/$build-r$r.json"
  done
done
