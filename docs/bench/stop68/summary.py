"""Issue 38's rows from full.sh's files: python3 summary.py full/*.json

Per shape and row, the value of each round: 4 KiB ops/s shm / gRPC and p50,
1 MiB and 16 MiB shm GB/s against memcpy (pulls; then, in runs that measured
it, against memcpy into the window's buffers, "xW") or copy-then-SGD (pushes),
raw TCP and TCP+SGD (--sgd-floor), and each side's CPU s/GB."""
import collections
import json
import re
import sys

rows = collections.defaultdict(list)
for path in sorted(sys.argv[1:]):
    shape = re.search(r"(\dx\d)", path).group(1)
    by = {}
    for line in open(path):
        d = json.loads(line)
        by[(d["mode"], d["encoding"].split()[-1], d["size_bytes"])] = d
    for (mode, path_name, size), d in sorted(by.items()):
        if path_name != "shm":
            continue
        s = d.get("servers") or {}
        if size == 4096:
            grpc = by.get((mode, "grpc", size))
            rows[(shape, size, mode)].append(
                f"{d['rpcs_per_sec']/1e3:.0f}k/{grpc['rpcs_per_sec']/1e3:.0f}k="
                f"{d['rpcs_per_sec']/grpc['rpcs_per_sec']:.1f}x p50 {d['p50_us']:.0f}")
        else:
            gbps = d["throughput_bytes_per_sec"] / 1e9
            floor = s.get("floor_bytes_per_sec") or 0
            tcp = d.get("tcp_throughput_bytes_per_sec") or 0
            sgd = s.get("tcp_sgd_bytes_per_sec") or 0
            window = s.get("memcpy_window_bytes_per_sec") if mode == "pull" else None
            beside = f" xW {gbps*1e9/window:.2f}" if window else ""
            rows[(shape, size, mode)].append(
                f"{gbps:.1f}/{floor/1e9:.1f}={gbps*1e9/floor:.2f}{beside} tcp {tcp/1e9:.1f}"
                f" tcp+sgd {sgd/1e9:.1f} cpu {d.get('client_cpu_sec_per_gb') or 0:.3f}"
                f"/{d.get('server_cpu_sec_per_gb') or 0:.3f}")
for (shape, size, mode), values in sorted(rows.items()):
    print(f"{shape} {size:>8} {mode:4} | " + " | ".join(values))
