import json,sys,glob,os,re
rows={}
for f in sorted(glob.glob(sys.argv[1]+'/kv-*.json')):
    tag=os.path.basename(f)[3:-5]
    for line in open(f):
        d=json.loads(line)
        key=(d['encoding'].split()[-1],d['mode'],re.sub(r'-r\d+','',tag))
        rows.setdefault(key,[]).append("%.0fk/%s" % (d['rpcs_per_sec']/1e3, d['p50_us']))
for k in sorted(rows): print(k, ' '.join(rows[k]))
