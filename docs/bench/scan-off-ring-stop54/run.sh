#!/bin/bash
# kv through shm, before (a build of fa847b1) and after (gradients scanned off the ring), interleaved.
for round in 1 2 3; do
  for bin in base scan; do
    echo "== round $round $bin"
    /tmp/bin-$bin/ps-microbench kv --sizes 4KiB,1MiB,16MiB --seconds 2 --data-path shm --sgd-floor --json 2>/dev/null > /tmp/kvscan-$round-$bin.json
    python3 - /tmp/kvscan-$round-$bin.json <<'PY'
import json,sys
for line in open(sys.argv[1]):
    d=json.loads(line); s=d['servers']
    print(f"  {d['mode']:5} {d['payload'][:14]:14} GB/s {d['throughput_bytes_per_sec']/1e9:6.2f} ops/s {d['rpcs_per_sec']:9.0f} p50 {d['p50_us']:7} ratio {s['ratio_vs_floor']:.2f} floor {s['floor_bytes_per_sec']/1e9:5.1f} cores srv {s['servers'][0]['cores']:.2f} wk {s['workers'][0]['cores']:.2f}")
PY
  done
done
