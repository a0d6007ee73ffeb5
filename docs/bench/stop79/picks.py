#!/usr/bin/env python3
"""Summarises a kv run's debug log of ring writers' rounds (RUST_LOG=ps_shm::stores=debug):
rounds, main rounds on streaming stores, quantiles of streaming ÷ ordinary cost.
Usage: picks.py LOG... (plain or .gz)"""
import gzip, re, sys
for path in sys.argv[1:]:
    ratios, rounds, main_streaming = [], 0, 0
    opener = gzip.open if path.endswith(".gz") else open
    for line in opener(path, "rt", errors="replace"):
        line = re.sub(r"\x1b\[[0-9;]*m", "", line)
        if "round ends" not in line:
            continue
        rounds += 1
        o = float(re.search(r"ordinary_ns_per_byte=([0-9.e-]+)", line).group(1))
        s = float(re.search(r"streaming_ns_per_byte=([0-9.e-]+)", line).group(1))
        ratios.append(s / o)
        main_streaming += "next=Streaming trial=false" in line
    ratios.sort()
    n = len(ratios)
    q = [round(ratios[int(p * (n - 1))], 2) for p in (0, 0.1, 0.25, 0.5, 0.75, 0.9, 1)] if n else []
    print(f"{path}: {rounds} rounds, {main_streaming} main rounds on streaming, "
          f"streaming/ordinary min,10,25,50,75,90%,max {q}")
