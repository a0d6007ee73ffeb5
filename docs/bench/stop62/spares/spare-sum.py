import json,sys,glob,re
from datetime import datetime
def t(l): return datetime.strptime(l[:26],"%Y-%m-%dT%H:%M:%S.%f").timestamp()
for f in sorted(glob.glob(sys.argv[1]+'/*.json'), key=lambda f:(f.split('/')[-1].rsplit('-',1)[0], int(f.rsplit('-',1)[1][:-5]))):
    d=json.load(open(f)); L=[l for l in open(f[:-5]+'.log') if l[:4]=='2026']
    placed=[t(l) for l in L if 'placement from' in l][0]; ready=[t(l) for l in L if 'trainer ready' in l][-1]
    ww=max(w['wall_seconds'] for w in d['per_worker'])
    print(f.split('/')[-1][:-5].ljust(16), f"ex/s {d['examples_per_second']:8.0f} wall {1e3*d['wall_seconds']:6.1f} ms  set-up+tear-down {1e3*(d['wall_seconds']-ww):5.1f} ms  placement->ready {1e3*(ready-placed):4.1f} ms")
