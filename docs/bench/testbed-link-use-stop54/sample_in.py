import time,sys,json
rows=[];t0=time.time()
while time.time()-t0<float(sys.argv[2]):
    try: txt=open("/proc/self/net/dev").read()
    except Exception: break
    t=time.time(); d={}
    for line in txt.splitlines()[2:]:
        name,rest=line.split(":",1); f=rest.split()
        d[name.strip()]=(int(f[0]),int(f[8]))
    rows.append((t,d)); time.sleep(0.005)
json.dump(rows,open(sys.argv[1],"w"))
