import json,sys,glob,collections
d=collections.defaultdict(list)
for f in sorted(sys.argv[1:]):
    key=f.split('/')[-1].rsplit('-r',1)[0]
    for l in open(f):
        r=json.loads(l)
        if 'shm' not in r['encoding']: continue
        fg=r.get('figures',{})
        d[(key,r['mode'],r['payload'].split(' W')[0])].append((round(r['rpcs_per_sec']/1000),r['p50_us'],round(fg.get('round_trip_p50_us') or 0,1)))
for k,v in sorted(d.items()): print(k,v)
