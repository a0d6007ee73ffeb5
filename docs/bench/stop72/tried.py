"""Prints tried.sh's runs: for each configuration, both workers' examples/s
per round and worker 0's time split per step (µs) in the first round.
Usage: python3 tried.py DIR"""
import glob, json, os, re, sys
from collections import defaultdict

d = sys.argv[1]
def split(w):
    n = w["steps"]
    return " ".join(f"{k} {v['seconds'] / n * 1e6:.0f}" for k, v in w["time_split"].items()
                    if k in ("compute", "push", "wait", "pull"))
runs = defaultdict(dict)
for f in glob.glob(os.path.join(d, "*-w0.json")):
    name, r = re.match(r"([\w]+)-r(\d+)-w0", os.path.basename(f)).groups()
    ws = [json.load(open(f.replace("-w0", f"-w{i}"))) for i in (0, 1)]
    runs[name][int(r)] = (sum(w["examples_per_second"] for w in ws), split(ws[0]))
for f in glob.glob(os.path.join(d, "local*-*.json")):
    name, p, r = re.match(r"(local\w*)-(\w+)-r(\d+)", os.path.basename(f)).groups()
    j = json.load(open(f))
    runs[f"{name} {p}"][int(r)] = (j["examples_per_second"], split(j["per_worker"][0]))
for name in sorted(runs):
    rs = runs[name]
    print(f"{name:16} " + ", ".join(f"{rs[r][0] / 1e3:.0f}k" for r in sorted(rs)) + f" | {rs[min(rs)][1]}")
