import json,sys
for f in sys.argv[1:]:
    for l in open(f):
        d=json.loads(l)
        if 'shm' not in d.get('encoding',''): continue
        s=d.get('servers') or {}
        g=lambda k: s.get(k) if k in s else d.get(k)
        print(f"{f.split('/')[-1]:22} {d['mode']:5} {d['payload'][:10]:10} {d['throughput_bytes_per_sec']/1e9:6.2f} GB/s memcpy {(g('memcpy_bytes_per_sec') or 0)/1e9:6.2f} floor {(g('floor_bytes_per_sec') or 0)/1e9:6.2f} ratio {g('ratio_vs_floor') or 0:5.2f} ring {g('ratio_vs_ring') or 0:5.2f} cpu w/s {d.get('client_cpu_sec_per_gb') or 0:.3f}/{d.get('server_cpu_sec_per_gb') or 0:.3f} p50 {d['p50_us']}")
