import json,sys,glob,os,re,collections
rows=collections.defaultdict(list)
for f in sorted(glob.glob(sys.argv[1]+'/*.json')):
    tag=re.sub(r'-r\d+\.json','',os.path.basename(f))
    d=json.load(open(f))
    w=d['per_worker'][0]; ts=w['time_split']; st=w['steps']
    rows[tag].append("%.0fk(c%.0f/p%.0f/w%.0f/l%.0f)" % (d['examples_per_second']/1e3, *(ts[k]['seconds']/st*1e6 for k in ['compute','push','wait','pull'])))
for k in sorted(rows): print(k, ' '.join(rows[k]))
