# Before/after table from kv JSON lines: one row per (shape, key, op), shm and gRPC, each run's figures.
import json,sys,collections
runs=collections.defaultdict(list)
for f in sys.argv[1:]:
    who='new' if '-new2-' in f else 'base'
    for l in open(f):
        if not l.strip().startswith('{'): continue
        r=json.loads(l); s=r['servers']
        path=r['encoding'].split()[-1]
        key=(r['payload'].split(' W')[0], r['mode'])
        runs[(key,who,path)].append((r['p50_us'], r['throughput_bytes_per_sec']/1e9, s.get('ratio_vs_floor'), s.get('memcpy_bytes_per_sec',0)/1e9, sum(x['cores'] for x in s['servers']), sum(x['cores'] for x in s['workers'])))
keys=sorted({k for (k,_,_) in runs}, key=lambda k:(k[0].split()[1], int(k[0].split('KiB')[0]) if 'KiB' in k[0] else int(k[0].split('MiB')[0])*1024, k[1]))
print("| key | op | shm p50 µs before → after | shm GB/s before → after | gRPC GB/s (same runs) | shm / floor after | memcpy GB/s |")
print("|---|---|---|---|---|---|---|")
f=lambda xs,i,fmt: ", ".join(fmt%x[i] for x in xs)
for k in keys:
    b=runs[(k,'base','shm')]; n=runs[(k,'new','shm')]; g=runs[(k,'base','grpc')]+runs[(k,'new','grpc')]
    print("| %s | %s | %s → %s | %s → **%s** | %s | %s | %s |"%(k[0],k[1],f(b,0,'%.0f'),f(n,0,'%.0f'),f(b,1,'%.2f'),f(n,1,'%.2f'),f(g,1,'%.2f'),f(n,2,'%.2f'),f(n,3,'%.0f')))
