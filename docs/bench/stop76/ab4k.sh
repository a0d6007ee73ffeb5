#!/bin/bash
# Interleaved kv 4 KiB rows (gRPC and shm, with the floors) for builds A and B
# at SHAPE, ROUNDS rounds. Usage: ab4k.sh OUT ROUNDS SHAPE A B
set -u
OUT=$1; R=$2; SH=$3; A=$4; B=$5
mkdir -p "$OUT"
for r in $(seq 1 "$R"); do
  for X in "$A" "$B"; do
    n=$(basename "$X")
    "$X/ps-microbench" kv --servers ${SH%x*} --workers ${SH#*x} --sizes 4KiB --seconds 2 \
        --data-path grpc,shm --json > "$OUT/$n-$SH-r$r.json" 2>/dev/null
    python3 - "$OUT/$n-$SH-r$r.json" "$n $SH r$r" <<'PY'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
by = {(r['mode'], r['encoding'].split()[-1]): r for r in rows}
out = []
for mode in ('push', 'pull'):
    s, g = by[(mode, 'shm')], by[(mode, 'grpc')]
    out.append(f"{mode} {s['rpcs_per_sec']/1e3:.0f}k/{g['rpcs_per_sec']/1e3:.0f}k="
               f"{s['rpcs_per_sec']/g['rpcs_per_sec']:.1f}x p50 {s['p50_us']:.0f} µs"
               f" cpu w/s {s.get('client_cpu_sec_per_gb') or 0:.2f}/{s.get('server_cpu_sec_per_gb') or 0:.2f} s/GB")
print(sys.argv[2], '|', ' | '.join(out))
PY
  done
done
