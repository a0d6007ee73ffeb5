#!/bin/bash
# nicekv.sh BUILD SHAPE N OUT: kv 4KiB over shm with kv-worker threads reniced to N
B=$1; SH=$2; N=$3; OUT=$4
$B/ps-microbench kv --servers ${SH%x*} --workers ${SH#*x} --sizes 4KiB --seconds 2 --data-path shm --json > $OUT 2>/dev/null &
kv=$!
while kill -0 $kv 2>/dev/null; do
  if [ "$N" != 0 ]; then
  for p in $(pgrep -f "kv-worker"); do for t in /proc/$p/task/*; do t=${t##*/}; [ -e /tmp/niced.$t ] || { renice -n $N -p $t >/dev/null 2>&1; touch /tmp/niced.$t; }; done; done
  fi
  sleep 0.05
done
rm -f /tmp/niced.*
python3 -c "
import json
for l in open('$OUT'):
    r=json.loads(l); print('$SH nice $N', r['mode'], f\"{r['rpcs_per_sec']/1e3:.0f}k p50 {r['p50_us']}\")
"
