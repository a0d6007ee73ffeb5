# GB/s and ratio to the same run's floor (memcpy for pulls, copy-then-SGD for
# pushes), every round, per shape, op, size and build.
# Usage: python3 gbps.py DIR/*-r*.json
import json, sys, collections
rows = collections.defaultdict(list)
for f in sys.argv[1:]:
    b, t, _ = f.split("/")[-1][:-5].split("-")
    for line in open(f):
        d = json.loads(line)
        s = d["servers"]
        rows[(t, d["mode"], d["payload"].split()[0], b)].append(
            (d["throughput_bytes_per_sec"] / 1e9, s["ratio_vs_floor"]))
for k, v in sorted(rows.items()):
    print(*k, "GB/s", " ".join(f"{x:.2f}" for x, _ in v),
          "ratio", " ".join(f"{r:.2f}" for _, r in v))
