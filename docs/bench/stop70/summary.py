"""Prints ab.sh's rows: kv's 4 KiB operations/s and p50 per build and shape,
shm over gRPC, and ps-local's examples/s with its per-step split; then
plx.sh's extra ps-local rounds, and the medians over all ps-local rounds.
Usage: python3 summary.py DIR"""
import glob, json, os, re, statistics, sys
from collections import defaultdict

d = sys.argv[1]
kv = defaultdict(list)
for f in sorted(glob.glob(os.path.join(d, "kv-*.json"))):
    build, shape, rnd = re.match(r"kv-(\w+)-(\dx\d)-r(\d+)", os.path.basename(f)).groups()
    rows = [json.loads(l) for l in open(f) if l.strip()]
    by = {(r["mode"], r["encoding"].split()[-1]): r for r in rows}
    for op in ("push", "pull"):
        s, g = by[(op, "shm")], by[(op, "f32")] if (op, "f32") in by else by[(op, "grpc")]
        kv[(shape, op, build)].append(
            f"{s['rpcs_per_sec']/1e3:.0f}k p50 {s['p50_us']:.0f} ({s['rpcs_per_sec']/g['rpcs_per_sec']:.2f}x gRPC {g['rpcs_per_sec']/1e3:.0f}k)")
for key in sorted(kv):
    print(*key, " | ".join(kv[key]))
# Shared memory's 4 KiB rows against the floors of the same run: raw TCP's
# bytes/s, and the rings' own round trips (their rate, and their p50 for pushes).
floors = defaultdict(list)
for f in sorted(glob.glob(os.path.join(d, "kv-*.json"))):
    build, shape = re.match(r"kv-(\w+)-(\dx\d)", os.path.basename(f)).groups()
    for r in (json.loads(l) for l in open(f) if l.strip()):
        if r["encoding"].endswith("shm"):
            floors[(shape, r["mode"], build)].append(r)
def spread(rows, field, where=lambda r: r["servers"]):
    v = [where(r)[field] for r in rows if where(r).get(field) is not None]
    return f"{min(v):.2f}-{max(v):.2f}" if v else "-"
for key in sorted(floors):
    rows = floors[key]
    print(*key, "floors: x raw TCP", spread(rows, "ratio_vs_tcp", lambda r: r),
          "x round trips/s", spread(rows, "ops_vs_round_trips"),
          "p50 x round trip", spread(rows, "p50_vs_round_trip"))
pl = defaultdict(list)
for f in sorted(glob.glob(os.path.join(d, "pl-*.json"))):
    build, path, rnd = re.match(r"pl-(\w+)-(\w+)-r(\d+)", os.path.basename(f)).groups()
    j = json.load(open(f))
    w = j["per_worker"][0]; n = w["steps"]
    split = " ".join(f"{k} {v['seconds']/n*1e6:.0f}" for k, v in w["time_split"].items()
                     if k in ("compute", "push", "wait", "pull"))
    pl[(build, path, rnd)] = (j["examples_per_second"], split)
for build in ("base", "new"):
    for rnd in sorted({k[2] for k in pl}):
        g, s = pl.get((build, "grpc", rnd)), pl.get((build, "shm", rnd))
        if g and s:
            print(f"ps-local {build} r{rnd}: shm {s[0]/1e3:.0f}k ({s[1]}) grpc {g[0]/1e3:.0f}k ({g[1]}) ratio {s[0]/g[0]:.2f}")
# ps-local's extra rounds (plx-*): examples/s per build and path, and medians.
for build in ("base", "new1"):
    for path in ("shm", "grpc"):
        v = [json.load(open(f))["examples_per_second"] / 1e3
             for f in sorted(glob.glob(os.path.join(d, f"plx-{build}-{path}-r*.json")))]
        if v:
            print(f"ps-local x{len(v)} {build} {path}:", " ".join(f"{x:.0f}" for x in v),
                  f"median {statistics.median(v):.0f}k")
# All ps-local rounds of a build and path (ab.sh's pl-* and plx.sh's plx-*).
for build, extra in (("base", "base"), ("new", "new1")):
    for path in ("shm", "grpc"):
        files = glob.glob(os.path.join(d, f"pl-{build}-{path}-r*.json"))
        files += glob.glob(os.path.join(d, f"plx-{extra}-{path}-r*.json"))
        v = [json.load(open(f))["examples_per_second"] / 1e3 for f in files]
        if v:
            print(f"ps-local all {len(v)} {build} {path}: median {statistics.median(v):.0f}k"
                  f" ({min(v):.0f}-{max(v):.0f})")
