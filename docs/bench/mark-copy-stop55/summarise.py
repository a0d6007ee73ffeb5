import json,sys
for line in open(sys.argv[1]):
    d=json.loads(line); s=d['servers']
    ring = f"ring {s['ring_bytes_per_sec']/1e9:5.1f} vs-ring {s['ratio_vs_ring']:.2f}" if 'ring_bytes_per_sec' in s else ""
    print(f"  {d['mode']:5} {d['payload'][:14]:14} GB/s {d['throughput_bytes_per_sec']/1e9:6.2f} ops/s {d['rpcs_per_sec']:9.0f} p50 {d['p50_us']:7} vs-floor {s['ratio_vs_floor']:.2f} floor {s['floor_bytes_per_sec']/1e9:5.1f} memcpy {s['memcpy_bytes_per_sec']/1e9:5.1f} {ring} cores srv {s['servers'][0]['cores']:.2f} wk {s['workers'][0]['cores']:.2f}")
