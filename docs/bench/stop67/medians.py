# Medians (and ranges) of k ops/s and p50 µs per shape, path, op, size and
# build, over every round file given; "new" is the build under test, "base" the commit before it.
# Usage: python3 medians.py rounds-*/*.json grpc-and-shm-4KiB/*.json
import json, sys, collections, statistics
rows = collections.defaultdict(list)
for name in sys.argv[1:]:
    build, shape, _ = name.split('/')[-1][:-5].split('-')
    for line in open(name):
        r = json.loads(line)
        key = (shape, r['encoding'].split()[1], r['mode'], r['payload'].split()[0], build)
        rows[key].append((r['rpcs_per_sec'] / 1000, r['p50_us']))
for key, runs in sorted(rows.items()):
    ops = [o for o, _ in runs]
    p50 = [p for _, p in runs]
    print(*key, f"n={len(runs)} ops {statistics.median(ops):.0f}k ({min(ops):.0f}-{max(ops):.0f})",
          f"p50 {statistics.median(p50)} ({min(p50)}-{max(p50)})")
