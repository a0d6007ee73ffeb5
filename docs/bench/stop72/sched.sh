#!/bin/bash
# procs.sh's four processes at 600 epochs, with `perf sched record` over
# 0.5 s from 1.2 s in; then the intervals between one worker's compute runs
# (its runs on a core over 40 µs: a step's forward and backward pass) and
# the worker's summary.
# Usage: sched.sh BUILD_DIR grpc|shm OUT
set -u
B=$1; P=$2; OUT=$3; HERE=$(dirname "$0")
"$HERE/procs.sh" "$B" $P 600 "$OUT" &
sleep 1.2
perf sched record -o "$OUT.sched" -- sleep 0.5 >/dev/null 2>&1
wait
W=$(perf sched timehist -i "$OUT.sched" 2>/dev/null | awk '$3 ~ /^exe\[/ {print $3; exit}')
echo "worker thread $W"
perf sched timehist -i "$OUT.sched" 2>/dev/null | awk -v w="$W" '$3 == w && $NF+0 > 0.040 {print $1}' |
  python3 -c "
import sys, collections
t = [float(x) for x in sys.stdin]
d = sorted((b - a) * 1e6 for a, b in zip(t, t[1:]))
n = len(d)
print(n, 'steps; µs between compute runs: p10 %.0f p50 %.0f p90 %.0f p99 %.0f mean %.0f'
      % (d[n // 10], d[n // 2], d[9 * n // 10], d[99 * n // 100], sum(d) / n))
h = collections.Counter(int(x // 50) * 50 for x in d)
print('  '.join(f'{k}-{k + 50}: {100 * h[k] / n:.0f}%' for k in sorted(h) if k < 600))
"
