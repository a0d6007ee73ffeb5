"""Prints rounds.sh's runs: examples/s (both workers together) and worker 0's
time split per step in µs, for the four processes and for ps-local, with shm
over gRPC per round and the medians.
Usage: python3 summary.py DIR"""
import glob, os, re, statistics, sys

from runs import local, processes

d = sys.argv[1]
rows = {}
for f in glob.glob(os.path.join(d, "procs-*-w0.json")):
    p, r = re.match(r"procs-(\w+)-r(\d+)-w0", os.path.basename(f)).groups()
    rows[("processes", p, int(r))] = processes(f)
for f in glob.glob(os.path.join(d, "local-*.json")):
    p, r = re.match(r"local-(\w+)-r(\d+)", os.path.basename(f)).groups()
    rows[("ps-local", p, int(r))] = local(f)
for kind in ("processes", "ps-local"):
    ratios = []
    for r in sorted({k[2] for k in rows if k[0] == kind}):
        g, s = rows.get((kind, "grpc", r)), rows.get((kind, "shm", r))
        if g and s:
            ratios.append(s[0] / g[0])
            print(f"{kind} r{r}: shm {s[0]/1e3:.0f}k ({s[1]}) | grpc {g[0]/1e3:.0f}k ({g[1]}) | {s[0]/g[0]:.2f}x")
    for p in ("shm", "grpc"):
        v = [rows[k][0] / 1e3 for k in rows if k[0] == kind and k[1] == p]
        if v:
            print(f"{kind} {p}: median {statistics.median(v):.0f}k ({min(v):.0f}-{max(v):.0f})")
    if ratios:
        print(f"{kind} shm/grpc: median {statistics.median(ratios):.2f} ({min(ratios):.2f}-{max(ratios):.2f})")
