# Medians of ps-local's wall, worker loop and examples/s per build and path.
import json, sys, glob, statistics, collections
rows = collections.defaultdict(list)
for f in glob.glob(sys.argv[1] + "/*.json"):
    b, p, _ = f.split("/")[-1].split("-")
    d = json.load(open(f))
    loop = max(x["wall_seconds"] for x in d["per_worker"])
    rows[(b, p)].append((d["wall_seconds"], loop, d["examples_per_second"]))
for (b, p), v in sorted(rows.items()):
    wall, loop, ex = (statistics.median(x[i] for x in v) for i in range(3))
    print(f"{b:5} {p:5} n={len(v):2} wall {wall*1e3:6.1f} ms  loop {loop*1e3:6.1f} ms  "
          f"set-up+tear-down {(wall-loop)*1e3:5.1f} ms  {ex:8.0f} ex/s")
