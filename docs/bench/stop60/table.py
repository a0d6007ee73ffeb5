#!/usr/bin/env python3
"""Summarises kv JSON runs: one line per file, op, path and key."""
import json, sys
for name in sys.argv[1:]:
    for line in open(name):
        r = json.loads(line)
        s = r.get("servers") or {}
        cores = [round(x["cores"], 2) for x in s.get("servers", []) + s.get("workers", [])]
        print(f"{name:28} {r['mode']:5} {r['encoding']:9} {r['payload']:26} "
              f"{r['rpcs_per_sec']:>9.0f}/s p50 {r['p50_us']:>7} "
              f"rtt {s.get('round_trip_p50_us') or 0:5.1f} cores {cores}")
