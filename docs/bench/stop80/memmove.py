#!/usr/bin/env python3
"""Share of each process's samples in memmove/memcpy, and their callers, from
`perf script` output of a kv run recorded with --call-graph dwarf
(usage: memmove.py PERF_SCRIPT_TXT...)."""
import collections
import re
import sys

for path in sys.argv[1:]:
    samples = open(path).read().split("\n\n")
    callers, n, moved = collections.Counter(), collections.Counter(), collections.Counter()
    for sample in samples:
        lines = [l.strip() for l in sample.strip().split("\n") if l.strip()]
        if not lines:
            continue
        frames = [re.sub(r"^[0-9a-f]+ ", "", l) for l in lines[1:]]
        side = "server" if any("ps-server" in f for f in frames) else "worker"
        n[side] += 1
        if frames and re.search("__mem(move|cpy)", frames[0]):
            moved[side] += 1
            for frame in frames[1:]:
                if "(inlined)" not in frame:
                    callers[(side, re.sub(r"\+0x.*", "", frame)[:90])] += 1
                    break
    print(path, {side: f"{100 * moved[side] / n[side]:.1f}% of {n[side]}" for side in n})
    for (side, caller), count in callers.most_common(8):
        print(f"  {count:4d} {side} {caller}")
