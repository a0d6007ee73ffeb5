#!/bin/bash
# Interleaved kv push runs over shm for several builds. Usage: abn.sh OUT ROUNDS SHAPE SIZE BUILD...
set -u
OUT=$1; R=$2; SH=$3; SZ=$4; shift 4
mkdir -p "$OUT"
for r in $(seq 1 "$R"); do
  for X in "$@"; do
    n=$(basename "$X")
    "$X/ps-microbench" kv --servers ${SH%x*} --workers ${SH#*x} --sizes $SZ --seconds 2 \
        --data-path shm --sgd-floor --json > "$OUT/$n-$SH-$SZ-r$r.json" 2>/dev/null
    python3 -c "
import json
for l in open('$OUT/$n-$SH-$SZ-r$r.json'):
    if not l.strip(): continue
    r=json.loads(l); s=r['servers']
    if r['mode']=='push': print('$n $SH $SZ r$r', f\"push {r['throughput_bytes_per_sec']/1e9:5.1f} GB/s ÷floor {s.get('ratio_vs_floor',0):.2f} p50 {r['p50_us']} cpu {r['client_cpu_sec_per_gb']:.3f}/{r['server_cpu_sec_per_gb']:.3f}\")
"
  done
done
