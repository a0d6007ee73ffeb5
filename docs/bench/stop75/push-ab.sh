#!/bin/bash
# Interleaved runs of kv 1 MiB over shm at SHAPE for builds A and B; prints each
# run's push and pull rows. Usage: push-ab.sh OUT ROUNDS SHAPE A B [SIZES]
set -u
OUT=$1; R=$2; SH=$3; A=$4; B=$5; SZ=${6:-1MiB}
mkdir -p "$OUT"
for r in $(seq 1 "$R"); do
  for X in "$A" "$B"; do
    n=$(basename "$(dirname "$X")")-$(basename "$X")
    "$X/ps-microbench" kv --servers ${SH%x*} --workers ${SH#*x} --sizes $SZ --seconds 2 \
        --data-path shm --sgd-floor --json > "$OUT/$n-$SH-r$r.json" 2>/dev/null
    python3 -c "
import json,sys
for l in open('$OUT/$n-$SH-r$r.json'):
    if not l.strip(): continue
    r=json.loads(l); s=r['servers']
    if r['mode']=='push': print('$n $SH r$r', r['size_bytes'], f\"push {r['throughput_bytes_per_sec']/1e9:5.1f} GB/s ÷floor {s.get('ratio_vs_floor',0):.2f} p50 {r['p50_us']} cpu {r['client_cpu_sec_per_gb']:.3f}/{r['server_cpu_sec_per_gb']:.3f}\")
"
  done
done
