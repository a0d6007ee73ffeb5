# Summarises the interleaved rounds: k ops/s and p50 µs per shape, path, op and build.
# Usage: python3 summary.py docs/bench/stop64/interleaved/*.json
import json, sys, collections
rows = collections.defaultdict(list)
for name in sorted(sys.argv[1:]):
    build, shape, _ = name.split('/')[-1][:-5].split('-')
    for line in open(name):
        r = json.loads(line)
        rows[(shape, r['encoding'].split()[1], r['mode'], build)].append(
            f"{round(r['rpcs_per_sec'] / 1000)}k/{r['p50_us']}")
for key, runs in sorted(rows.items()):
    print(*key, ' '.join(runs))
