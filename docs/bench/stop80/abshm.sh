#!/bin/bash
# Usage: abshm.sh OUT ROUNDS SHAPE SIZE NAME=DIR...   interleaved kv over shm
set -u
OUT=$1; R=$2; SH=$3; SZ=$4; shift 4
mkdir -p "$OUT"
for r in $(seq 1 "$R"); do
  for spec in "$@"; do
    n=${spec%%=*}; X=${spec#*=}
    f="$OUT/$n-$SH-$SZ-r$r.json"
    "$X/ps-microbench" kv --servers ${SH%x*} --workers ${SH#*x} --sizes $SZ --seconds 2 --data-path shm --json > "$f" 2>/dev/null
    python3 -c "
import json
for l in open('$f'):
    d=json.loads(l)
    if d['mode']=='push': print('$n r$r', f\"push {d['rpcs_per_sec']/1e3:.0f}k p50 {d['p50_us']:.0f}\")
"
  done
done
