import json,sys
rows=json.load(open(sys.argv[1]))
names=sorted(set(n for r in rows for n in r[1] if n not in ("lo","br0")))
print(names)
# rates over 20ms bins; switch side: tx = toward host (host downlink), rx = from host (host uplink)
import math
t0=rows[0][0]
bin=float(sys.argv[2]) if len(sys.argv)>2 else 0.05
out=[]
prev=rows[0]
i=0
binned=[]
start=rows[0][0]
last=rows[0]
for r in rows[1:]:
    if r[0]-last[0]>=bin:
        dt=r[0]-last[0]
        rec={n:((r[1][n][0]-last[1][n][0])/dt/25e6,(r[1][n][1]-last[1][n][1])/dt/25e6) for n in names if n in last[1] and n in r[1]}
        binned.append((last[0]-start,rec)); last=r
for t,rec in binned:
    s=" ".join(f"{n[-8:]}:{u:4.2f}/{d:4.2f}" for n,(u,d) in sorted(rec.items()))
    print(f"{t:6.2f} {s}")
