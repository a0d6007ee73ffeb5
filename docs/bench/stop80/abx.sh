#!/bin/bash
# Usage: abx.sh OUT ROUNDS SHAPE SIZE NAME=DIR[:ENV=VAL]...  interleaved kv push over shm; logs kept gz
set -u
OUT=$1; R=$2; SH=$3; SZ=$4; shift 4
mkdir -p "$OUT"
for r in $(seq 1 "$R"); do
  for spec in "$@"; do
    n=${spec%%=*}; rest=${spec#*=}; X=${rest%%:*}; E=""; [[ "$rest" == *:* ]] && E=${rest#*:}
    f="$OUT/$n-$SH-$SZ-r$r"
    env RUST_LOG=ps_shm::stores=debug $E "$X/target/release/ps-microbench" kv --servers ${SH%x*} --workers ${SH#*x} --sizes $SZ --seconds 2 --data-path shm --json > "$f.json" 2> >(gzip > "$f.log.gz")
    python3 -c "
import json
for l in open('$f.json'):
    d=json.loads(l); s=d['servers']
    if d['mode']=='push': print('$n r$r', f\"push {d['throughput_bytes_per_sec']/1e9:5.1f} GB/s ÷floor {s.get('ratio_vs_floor',0):.2f} p50 {d['p50_us']:.0f} cpu w {d['client_cpu_sec_per_gb']:.3f} s {d['server_cpu_sec_per_gb']:.3f}\")
"
  done
done
