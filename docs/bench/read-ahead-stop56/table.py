"""Prints a row per kv JSON file named: operations/s for 4 KiB keys, and for
larger ones the ratio to the row's floor (copy-then-SGD for pushes, memcpy
for pulls)."""
import json
import sys

for name in sys.argv[1:]:
    cells = []
    for line in open(name):
        row = json.loads(line)
        size, shape = row['payload'].split()[:2]
        if size.endswith('KiB'):
            value = f"{row['rpcs_per_sec'] / 1e3:.0f}k"
        else:
            value = f"{row['servers']['ratio_vs_floor']:.2f}"
        cells.append(f"{row['mode']} {size} {shape}={value}")
    print(name, ' '.join(cells))
