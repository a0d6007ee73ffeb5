import json,glob,sys,re
d=sys.argv[1]
rows={}
for f in glob.glob(d+'/*.json'):
    name=f.split('/')[-1]; m=re.match(r'(.*)-r(\d+)\.json',name)
    j=json.load(open(f)); steps=j['steps']
    ts=j['per_worker'][0]['time_split']
    us=lambda k: ts[k]['seconds']/steps*1e6
    st={}
    for line in open(f[:-5]+'.stat'):
        p=line.strip().split(',')
        if len(p)>3 and p[0] and p[0][0].isdigit(): st[p[2].split(':')[-1]]=float(p[0])
    rows.setdefault(int(m.group(2)),[]).append((m.group(1), int(j['examples_per_second']/1000), us('compute'), us('push')+us('pull'), us('wait'), st['task-clock']*1e3/steps, st['sys_enter_epoll_wait']/steps, st['sys_enter_sched_yield']/steps, st['sys_enter_futex']/steps, st['sys_enter_write']/steps))
print('round build:k ex/s compute exchange wait (µs a step, worker 0) | CPU µs a step, epoll_wait sched_yield futex write a step')
for r in sorted(rows):
    print(r, ' || '.join(f"{n}:{e}k c{c:.0f} x{x:.0f} w{w:.0f} | cpu{cpu:.0f} ep{ep:.1f} y{y:.1f} fx{fx:.2f} wr{wr:.2f}" for n,e,c,x,w,cpu,ep,y,fx,wr in sorted(rows[r])))
