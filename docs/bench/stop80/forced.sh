#!/bin/bash
# Usage: forced.sh OUT ROUNDS SHAPE SIZE  (b1 chooser; b2 forced ordinary; b2 forced streaming), interleaved
set -u
OUT=$1; R=$2; SH=$3; SZ=$4
mkdir -p "$OUT"
for r in $(seq 1 "$R"); do
  for spec in chooser=/tmp/b1: ordinary=/tmp/b2:PS_SCRATCH_STORES=ordinary streaming=/tmp/b2:PS_SCRATCH_STORES=streaming; do
    n=${spec%%=*}; rest=${spec#*=}; X=${rest%%:*}; E=${rest#*:}
    f="$OUT/$n-$SH-$SZ-r$r.json"
    env $E "$X/target/release/ps-microbench" kv --servers ${SH%x*} --workers ${SH#*x} --sizes $SZ --seconds 2 --data-path shm --json > "$f" 2>/dev/null
    python3 -c "
import json
for l in open('$f'):
    d=json.loads(l); s=d['servers']
    if d['mode']=='push': print('$n r$r', f\"push {d['throughput_bytes_per_sec']/1e9:5.1f} GB/s ÷floor {s.get('ratio_vs_floor',0):.2f} cpu w {d['client_cpu_sec_per_gb']:.3f} s {d['server_cpu_sec_per_gb']:.3f}\")
"
  done
done
