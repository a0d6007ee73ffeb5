#!/usr/bin/env python3
"""Per key, shape and operation: each build's operations/s and p50 over the
rounds, and shared memory's operations/s over gRPC's in the same run.
Usage: compare.py r*-*.json (named r{round}-{shape}-{build}.json)."""
import collections, json, re, sys

rows = collections.defaultdict(list)
ratio = collections.defaultdict(list)
for name in sorted(sys.argv[1:]):
    build = re.search(r"-([^-]+)\.json$", name).group(1)
    runs = {}
    for line in open(name):
        r = json.loads(line)
        key = r["payload"].split(" W=")[0]
        path = r["encoding"].split()[-1]
        runs[(key, r["mode"], path)] = r
        rows[(key, r["mode"], path, build)].append(
            f"{r['rpcs_per_sec'] / 1000:.1f}k/{r['p50_us']:g}")
    for (key, mode, path), r in runs.items():
        grpc = runs.get((key, mode, "grpc"))
        if path == "shm" and grpc:
            ratio[(key, mode, build)].append(
                f"{r['rpcs_per_sec'] / grpc['rpcs_per_sec']:.2f}")
print("key op path build: ops/s / p50 µs per round")
for k in sorted(rows):
    print(" ".join(k), ": ", ", ".join(rows[k]))
print("shm ÷ gRPC operations/s, same run")
for k in sorted(ratio):
    print(" ".join(k), ": ", ", ".join(ratio[k]))
