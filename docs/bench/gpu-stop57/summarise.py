"""One line per row of the stop-57 kv runs: ops/s, p50, GB/s and the floors' ratios."""
import json
import sys

for name in sys.argv[1:]:
    print(name)
    for line in open(name):
        d = json.loads(line)
        s = d["servers"]
        floor = s.get("ratio_vs_floor")
        ring = s.get("ratio_vs_ring")
        rt = s.get("round_trip_p50_us")
        print(f"  {d['mode']:5} {d['encoding']:9} {d['payload'][:10]:10}"
              f" ops/s {d['rpcs_per_sec']:8.0f} p50 {d['p50_us']:7.0f} µs"
              f" {d['throughput_bytes_per_sec'] / 1e9:6.2f} GB/s"
              f" floor {floor if floor is None else round(floor, 2)}"
              f" ring {ring if ring is None else round(ring, 2)}"
              f" memcpy {s['memcpy_bytes_per_sec'] / 1e9 if s.get('memcpy_bytes_per_sec') else 0:5.1f}"
              f" rt {rt if rt is None else round(rt, 1)}")
