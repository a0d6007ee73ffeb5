"""Prints tried.sh's runs: for each configuration, both workers' examples/s
per round and worker 0's time split per step (µs) in the first round.
Usage: python3 tried.py DIR"""
import glob, os, re, sys
from collections import defaultdict

from runs import local, processes

d = sys.argv[1]
runs = defaultdict(dict)
for f in glob.glob(os.path.join(d, "*-w0.json")):
    name, r = re.match(r"([\w]+)-r(\d+)-w0", os.path.basename(f)).groups()
    runs[name][int(r)] = processes(f)
for f in glob.glob(os.path.join(d, "local*-*.json")):
    name, p, r = re.match(r"(local\w*)-(\w+)-r(\d+)", os.path.basename(f)).groups()
    runs[f"{name} {p}"][int(r)] = local(f)
for name in sorted(runs):
    rs = runs[name]
    print(f"{name:16} " + ", ".join(f"{rs[r][0] / 1e3:.0f}k" for r in sorted(rs)) + f" | {rs[min(rs)][1]}")
