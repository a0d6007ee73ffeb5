#!/usr/bin/env python3
"""A stacked bar per ps-testbed run: the mean step time of its first worker,
split by phase (compute, gather, push, wait, pull, apply), as an SVG.

    scripts/testbed_chart.py OUT.svg LABEL=DIR/report.json [LABEL=...]

A pipelined step's push and pull are one exchange; the worker books half of
its time to each (worker/src/step_time.rs). With segmented backward the
exchange runs beside the backward pass, and only its time after the pass is
booked, so the bar still adds up to the step."""
import json
import sys

COLORS = {"compute": "#4c72b0", "gather": "#8c8c8c", "push": "#dd8452",
          "wait": "#c44e52", "pull": "#55a868", "apply": "#8172b3", "other": "#cccccc"}


def main():
    if len(sys.argv) < 3:
        sys.exit(__doc__)
    out, runs = sys.argv[1], []
    for arg in sys.argv[2:]:
        label, path = arg.split("=", 1)
        worker = json.load(open(path))["workers"][0]
        runs.append((label, [(name, share * worker["step_ms"]) for name, share in worker["split"]]))
    longest = max(sum(ms for _, ms in phases) for _, phases in runs)
    left, width, bar, gap = 260, 560, 34, 18
    height = 60 + len(runs) * (bar + gap) + 40
    scale = width / longest
    svg = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{left + width + 40}" height="{height}" '
           f'font-family="sans-serif" font-size="13">',
           f'<text x="{left}" y="22" font-size="15">step time by phase, ms (first worker, mean over the run)</text>']
    for i, (label, phases) in enumerate(runs):
        y = 40 + i * (bar + gap)
        svg.append(f'<text x="{left - 8}" y="{y + bar / 2 + 5}" text-anchor="end">{label}</text>')
        x = left
        for name, ms in phases:
            if ms <= 0:
                continue
            w = ms * scale
            svg.append(f'<rect x="{x:.1f}" y="{y}" width="{w:.1f}" height="{bar}" fill="{COLORS[name]}">'
                       f'<title>{name} {ms:.0f} ms</title></rect>')
            if w > 34:
                svg.append(f'<text x="{x + w / 2:.1f}" y="{y + bar / 2 + 5}" text-anchor="middle" '
                           f'fill="white">{ms:.0f}</text>')
            x += w
        total = sum(ms for _, ms in phases)
        svg.append(f'<text x="{x + 6:.1f}" y="{y + bar / 2 + 5}">{total:.0f}</text>')
    y = height - 22
    x = left
    for name, color in COLORS.items():
        if name == "other":
            continue
        svg.append(f'<rect x="{x}" y="{y - 11}" width="12" height="12" fill="{color}"/>'
                   f'<text x="{x + 16}" y="{y}">{name}</text>')
        x += 16 + 9 * len(name) + 14
    svg.append("</svg>")
    with open(out, "w") as f:
        f.write("\n".join(svg) + "\n")


if __name__ == "__main__":
    main()
