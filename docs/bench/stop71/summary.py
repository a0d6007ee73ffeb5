"""Prints pulls.sh's 1 MiB pull rows: GB/s, p50, and the ratios to one
core's memcpy into one buffer (the floor kv reads a pull against) and into
as many buffers as the window (memcpy_window).
Usage: python3 summary.py DIR"""
import glob, json, os, re, sys

for f in sorted(glob.glob(os.path.join(sys.argv[1], "w*-r*.json"))):
    w, r = re.match(r"w(\d+)-r(\d+)", os.path.basename(f)).groups()
    for row in (json.loads(l) for l in open(f) if l.strip()):
        if row["mode"] != "pull":
            continue
        s = row["servers"]
        print(f"W={w} round {r}: {row['throughput_bytes_per_sec']/1e9:5.1f} GB/s "
              f"p50 {row['p50_us']:.0f} us | memcpy {s['memcpy_bytes_per_sec']/1e9:.1f} "
              f"-> {s['ratio_vs_floor']:.2f} | memcpy into W buffers "
              f"{s['memcpy_window_bytes_per_sec']/1e9:.1f} -> {s['ratio_vs_memcpy_window']:.2f} "
              f"| worker CPU s/GB {row['client_cpu_sec_per_gb']:.3f}")
