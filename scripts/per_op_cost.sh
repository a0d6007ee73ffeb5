#!/usr/bin/env bash
# Per-operation cost of ps-server under `ps-microbench kv`: context switches,
# CPU migrations and writev/recvfrom calls of the server process, divided by
# the operations it served (both phases of every row: the throughput phase's
# count, plus the latency phase's, estimated as each worker's seconds over its
# p50). With several servers, the newest is measured; every operation reaches
# each server, since each key is split over all of them.
#
#   scripts/per_op_cost.sh [KV ARGS...]     e.g. --sizes 4KiB --seconds 2 --unary
#
# Needs perf with the syscalls tracepoints (run as root). Uses the release
# binaries in target/release.
set -euo pipefail
cd "$(dirname "$0")/.."
bench=target/release/ps-microbench
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
"$bench" kv --json "$@" >"$out/rows.json" &
kv=$!
server=""
for _ in $(seq 200); do
    server=$(pgrep -n -f 'ps-server --listen' || true)
    [ -n "$server" ] && break
    sleep 0.05
done
[ -n "$server" ] || { echo "no ps-server appeared" >&2; exit 1; }
perf stat -x, -o "$out/stat.csv" -p "$server" \
    -e context-switches,cpu-migrations,syscalls:sys_enter_writev,syscalls:sys_enter_recvfrom,task-clock &
perf=$!
wait "$kv"
wait "$perf" || true
python3 - "$out/rows.json" "$out/stat.csv" <<'PY'
import json, sys
rows = [json.loads(line) for line in open(sys.argv[1]) if line.startswith("{")]
ops = 0.0
for r in rows:
    seconds = r["messages"] / max(r["rpcs_per_sec"], 1e-9)
    workers = len(r["servers"]["workers"])
    ops += r["messages"] + (workers * seconds * 1e6 / r["p50_us"] if r["p50_us"] else 0)
counts = {}
for line in open(sys.argv[2]):
    parts = line.strip().split(",")
    if len(parts) > 2 and parts[0] and parts[0][0].isdigit():
        counts[parts[2]] = float(parts[0])
print(f"server operations (both phases, estimated): {ops:,.0f}")
for name, value in counts.items():
    unit = "ms" if name == "task-clock" else ""
    per = value / ops * (1000 if name == "task-clock" else 1)
    print(f"{name:32s} {value:14,.0f} {unit:2s}  per op: {per:.3f}{' µs' if name == 'task-clock' else ''}")
PY
