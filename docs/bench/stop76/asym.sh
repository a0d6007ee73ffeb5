#!/bin/bash
# asym.sh LABEL SHAPE WSPIN WYIELD SSPIN SYIELD  (empty = product default)
L=$1; SH=$2
env ${3:+PS_SCRATCH_SPIN_US=$3} ${4:+PS_SCRATCH_YIELD_US=$4} ${5:+SV_SPIN=$5} ${6:+SV_YIELD=$6} \
  /tmp/b1/ps-microbench kv --servers ${SH%x*} --workers ${SH#*x} --sizes 4KiB --seconds 2 --data-path shm --json > /tmp/asym-$L.json 2>/dev/null
python3 -c "
import json
out=[]
for l in open('/tmp/asym-$L.json'):
    r=json.loads(l); out.append(f\"{r['mode']} {r['rpcs_per_sec']/1e3:.0f}k p50 {r['p50_us']:.0f}\")
print('$L $SH w=$3:$4 s=$5:$6 |', ' | '.join(out))
"
