import json,sys,glob,collections
rows=collections.defaultdict(list)
for f in sorted(sys.argv[1:]):
    d=json.load(open(f)); p=f.split('/')[-1].split('-')[-2]
    w=d['per_worker']; steps=d['steps']
    ts={k:sum(x['time_split'][k]['seconds'] for x in w)/len(w)/steps*1e6 for k in w[0]['time_split']}
    loop=max(x['wall_seconds'] for x in w)
    rows[p].append((d['examples_per_second'], d['wall_seconds'], loop, ts))
for p,v in rows.items():
    for e,wall,loop,ts in v:
        print(p, f"{e:9.0f} ex/s wall {wall*1e3:6.1f} ms worker wall {loop*1e3:6.1f} ms  per step us:", ' '.join(f"{k}={x:.1f}" for k,x in ts.items()))
