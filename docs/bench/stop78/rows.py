"""Each run's push row from push-ab.sh's files: python3 rows.py DIR..."""
import json
import sys

for folder in sys.argv[1:]:
    import glob
    for path in sorted(glob.glob(f"{folder}/*.json")):
        for line in open(path):
            if not line.strip():
                continue
            r = json.loads(line)
            if r["mode"] != "push":
                continue
            s = r["servers"]
            print(f"{path:32s} {r['size_bytes']:>9d} push {r['throughput_bytes_per_sec']/1e9:5.1f} GB/s"
                  f" ÷floor {s.get('ratio_vs_floor', 0):.2f} p50 {r['p50_us']:7.1f} µs"
                  f" cpu w/s {r['client_cpu_sec_per_gb']:.3f}/{r['server_cpu_sec_per_gb']:.3f} s/GB")
