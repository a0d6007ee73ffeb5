"""Prints ab-rows.sh's pull rows: GB/s, p50, ratio to one-buffer memcpy and to
the memcpy into W buffers, each side's CPU s/GB. Usage: rows-sum.py DIR"""
import glob, json, os, re, sys
rows = {}
for f in sorted(glob.glob(os.path.join(sys.argv[1], "*.json"))):
    b, sh, w, r = re.match(r"(\w+)-(\dx\d)-w(\d+)-r(\d+)", os.path.basename(f)).groups()
    for row in (json.loads(l) for l in open(f) if l.strip()):
        if row["mode"] != "pull":
            continue
        s = row["servers"]
        key = (row["size_bytes"] if "size_bytes" in row else row.get("size"), sh, int(w), b)
        rows.setdefault(key, []).append(
            f"{row['throughput_bytes_per_sec']/1e9:5.1f} GB/s p50 {row['p50_us']:5.0f} "
            f"÷memcpy {s['ratio_vs_floor']:.2f} ÷win {s['ratio_vs_memcpy_window']:.2f} "
            f"CPU w/s {row['client_cpu_sec_per_gb']:.3f}/{row.get('server_cpu_sec_per_gb', 0):.3f}")
for key in sorted(rows, key=str):
    for line in rows[key]:
        print(key, line)
