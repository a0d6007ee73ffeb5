"""Lists local-ab.sh's runs: examples/s and the per-step compute, push,
wait and pull microseconds of worker 0, by build and path, then each build's
shm ÷ gRPC examples/s round by round."""
import collections, glob, json, os, re, sys

rows = collections.defaultdict(list)
rate = {}
for f in sorted(glob.glob(os.path.join(sys.argv[1], "*.json"))):
    m = re.match(r"(\w+)-(\w+)-r(\d+)\.json", os.path.basename(f))
    build, path, r = m.group(1), m.group(2), int(m.group(3))
    d = json.load(open(f))
    w = d["per_worker"][0]
    split, steps = w["time_split"], w["steps"]
    us = [split[k]["seconds"] / steps * 1e6 for k in ("compute", "push", "wait", "pull")]
    rate[(build, path, r)] = d["examples_per_second"]
    rows[(build, path)].append((r, "%.0fk (%.0f/%.0f/%.0f/%.0f)" % (d["examples_per_second"] / 1e3, *us)))
for key in sorted(rows):
    print("%-4s %-4s" % key, "  ".join(v for _, v in sorted(rows[key])))
for build in sorted({b for b, _, _ in rate}):
    ratios = [rate[(build, "shm", r)] / rate[(build, "grpc", r)]
              for (b, p, r) in sorted(rate) if b == build and p == "shm" and (build, "grpc", r) in rate]
    print(build, "shm/grpc", " ".join("%.2f" % x for x in ratios))
