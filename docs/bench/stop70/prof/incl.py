import sys, collections
root = sys.argv[2]; path=sys.argv[1]
samples=[]; cur=[]
for line in open(path):
    s=line.strip()
    if not s:
        if cur: samples.append(cur); cur=[]
        continue
    cur.append(s)
if cur: samples.append(cur)
tot=len(samples); sel=[st for st in samples if any(root in f for f in st)]
inc=collections.Counter(); self_=collections.Counter()
for st in sel:
    for f in set(st): inc[f]+=1
    self_[st[0]]+=1
print(f"total {tot}, under {root}: {len(sel)} ({100*len(sel)/tot:.1f}%)")
print("-- inclusive (% of selected)")
for f,c in inc.most_common(int(sys.argv[3]) if len(sys.argv)>3 else 60): print(f"{100*c/len(sel):6.1f} {f[:150]}")
print("-- self")
for f,c in self_.most_common(30): print(f"{100*c/len(sel):6.1f} {f[:150]}")
