#!/usr/bin/env bash
# dmlc/ps-lite (C++ parameter server over ZeroMQ) run the way `ps-microbench kv`
# runs candle-ps: one f32 key split evenly over S servers, W worker processes,
# push then pull, latency (1 in flight) and throughput (--window in flight).
# The harness is bench/pslite/kv_bench.cc; see its header for what it measures.
#
#   scripts/pslite_bench.sh build
#       apt-get installs ps-lite's dependencies (libzmq3-dev, libprotobuf-dev,
#       protobuf-compiler, g++, make), unpacks ps-lite from $PSLITE_SRC into
#       target/pslite-build/ps-lite, builds libps.a with the system zmq and
#       protobuf (never downloading), then target/pslite-build/kv_bench.
#   scripts/pslite_bench.sh run [--servers S] [--workers W] [--size BYTES]
#                               [--window K] [--seconds N]
#       One JSON line per operation (push, pull) on stdout.
#   scripts/pslite_bench.sh run-rows [--servers S] [--workers W] [--batch B]
#                               [--width D] [--rows N] [--zipf A]
#                               [--window K] [--seconds N]
#       ps-lite's side of `ps-microbench rows` (bench/pslite/rows_bench.cc):
#       the same Zipf batches of embedding rows pushed, then pulled; one JSON
#       line per operation.
#
# Getting ps-lite: nothing here downloads it. PSLITE_SRC (default
# target/pslite-src) may be a source tree, a bare git repository (its HEAD is
# archived) or a .tar.gz. In this project, fetch it by hand with the `fetch`
# tool, source github:dmlc/ps-lite, and pass the git directory it returns:
#   PSLITE_SRC=/work/.mirror/dmlc+ps-lite/repo scripts/pslite_bench.sh build
# Elsewhere: git clone https://github.com/dmlc/ps-lite target/pslite-src
# Built and checked against ps-lite 15b8adf (2021).
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
BUILD="$ROOT/target/pslite-build"
SRC=${PSLITE_SRC:-$ROOT/target/pslite-src}
BIN="$BUILD/kv_bench"
ROWS_BIN="$BUILD/rows_bench"

die() { echo "pslite_bench: $*" >&2; exit 1; }

build() {
  local pkgs=(libzmq3-dev libprotobuf-dev protobuf-compiler g++ make)
  if ! dpkg -s "${pkgs[@]}" >/dev/null 2>&1; then
    echo "installing ${pkgs[*]}" >&2
    export DEBIAN_FRONTEND=noninteractive
    apt-get install -y -qq --no-install-recommends "${pkgs[@]}" >/dev/null ||
      { apt-get update -qq && apt-get install -y -qq --no-install-recommends "${pkgs[@]}" >/dev/null; }
  fi

  local tree="$BUILD/ps-lite"
  rm -rf "$tree"
  mkdir -p "$tree"
  if [[ -f "$SRC/include/ps/ps.h" ]]; then
    cp -a "$SRC/." "$tree/"
  elif [[ -f "$SRC/HEAD" && -d "$SRC/objects" ]]; then
    git --git-dir="$SRC" archive HEAD | tar -x -C "$tree"
  elif [[ -f "$SRC" && "$SRC" == *.tar.gz ]]; then
    tar -xzf "$SRC" -C "$tree" --strip-components=1
  else
    die "no ps-lite at PSLITE_SRC=$SRC: fetch github:dmlc/ps-lite by hand (see the top of $0)"
  fi
  [[ -f "$tree/Makefile" ]] || die "$SRC has no ps-lite Makefile"

  # ps-lite's Makefile downloads protobuf and zmq into $(DEPS_PATH) unless
  # $(DEPS_PATH)/include/{zmq.h,google/protobuf/message.h} exist. DEPS_PATH=/usr
  # points it at the system packages, PROTOC at the system protoc, and WGET=false
  # makes any download attempt fail instead of fetching. -msse2 is x86-only.
  if [[ "$(uname -m)" != x86_64 ]]; then
    sed -i 's/ -msse2//' "$tree/Makefile"
  fi
  make -C "$tree" ps DEPS_PATH=/usr PROTOC=protoc WGET=false >"$BUILD/make.log" 2>&1 ||
    { tail -30 "$BUILD/make.log" >&2; die "ps-lite build failed (log: $BUILD/make.log)"; }
  g++ -std=c++11 -O2 -Wall -Wno-deprecated-declarations \
    -I "$tree/include" -I "$tree/src" "$ROOT/bench/pslite/kv_bench.cc" \
    "$tree/build/libps.a" -lprotobuf-lite -lzmq -pthread -o "$BIN"
  g++ -std=c++11 -O2 -Wall -Wno-deprecated-declarations \
    -I "$tree/include" -I "$tree/src" "$ROOT/bench/pslite/rows_bench.cc" \
    "$tree/build/libps.a" -lprotobuf-lite -lzmq -pthread -o "$ROWS_BIN"
  echo "built $BIN and $ROWS_BIN" >&2
}

PIDS=()
LOGS=""
# With DMLC_LOCAL=1 ps-lite binds ipc:///tmp/PORT for each process and
# leaves the socket files behind: cleanup removes them.
IPC_FILES=()
cleanup() {
  local pid
  for pid in "${PIDS[@]}"; do kill "$pid" 2>/dev/null || true; done
  sleep 0.2
  for pid in "${PIDS[@]}"; do kill -9 "$pid" 2>/dev/null || true; done
  for pid in "${PIDS[@]}"; do wait "$pid" 2>/dev/null || true; done
  PIDS=()
  if ((${#IPC_FILES[@]})); then rm -f "${IPC_FILES[@]}"; fi
  IPC_FILES=()
  if [[ -n "$LOGS" && -z "${PSLITE_KEEP_LOGS:-}" ]]; then rm -rf "$LOGS"; fi
}

# Starts a scheduler, the servers and the workers of `bin` with the flags
# that follow, waits for them, and leaves their output in $LOGS.
launch() {
  local bin=$1 servers=$2 workers=$3 seconds=$4
  shift 4
  trap cleanup EXIT
  trap 'exit 130' INT TERM
  LOGS=$(mktemp -d "${TMPDIR:-/tmp}/pslite_bench.XXXXXX")

  # Free ports: bind them all at once (so they differ), then let them go.
  local ports
  read -r -a ports < <(python3 -c '
import socket, sys
socks = [socket.socket() for _ in range(int(sys.argv[1]))]
for s in socks: s.bind(("127.0.0.1", 0))
print(" ".join(str(s.getsockname()[1]) for s in socks))' $((1 + servers + workers)))
  if [[ -n "${DMLC_LOCAL:-}" && "${DMLC_LOCAL}" != 0 ]]; then
    local port
    for port in "${ports[@]}"; do IPC_FILES+=("/tmp/$port"); done
  fi

  # Two operations, two phases each, plus start-up: anything past this hangs.
  local limit
  limit=$(python3 -c "import sys; print(int(4 * float(sys.argv[1]) + 60))" "$seconds")
  export DMLC_NUM_SERVER=$servers DMLC_NUM_WORKER=$workers
  export DMLC_PS_ROOT_URI=127.0.0.1 DMLC_PS_ROOT_PORT=${ports[0]} DMLC_NODE_HOST=127.0.0.1
  local role i n=0
  for role in scheduler server worker; do
    local count=1
    [[ $role == server ]] && count=$servers
    [[ $role == worker ]] && count=$workers
    for ((i = 0; i < count; i++)); do
      DMLC_ROLE=$role PORT=${ports[n]} timeout -k 5 "$limit" "$bin" "$@" \
        >"$LOGS/$role-$i.out" 2>"$LOGS/$role-$i.err" &
      PIDS+=("$!")
      n=$((n + 1))
    done
  done

  # The first process to fail ends the run (cleanup stops the others).
  local running=("${PIDS[@]}") done_pid pid failed=0
  while ((${#running[@]})); do
    wait -n -p done_pid "${running[@]}" || { failed=1; break; }
    local still=()
    for pid in "${running[@]}"; do [[ $pid == "$done_pid" ]] || still+=("$pid"); done
    running=("${still[@]}")
  done
  if ((failed)); then
    tail -n 5 "$LOGS"/*.err >&2
    die "a ps-lite process failed (logs above)"
  fi
  PIDS=()
}

run() {
  local servers=1 workers=1 size=4096 window=8 seconds=5
  while (($#)); do
    (($# >= 2)) || die "$1 needs a value"
    case "$1" in
      --servers) servers=$2 ;;
      --workers) workers=$2 ;;
      --size) size=$2 ;;
      --window) window=$2 ;;
      --seconds) seconds=$2 ;;
      *) die "unknown flag $1 (run [--servers S] [--workers W] [--size BYTES] [--window K] [--seconds N])" ;;
    esac
    shift 2
  done
  [[ -x "$BIN" ]] || die "no $BIN: run '$0 build' first"
  ((size % (4 * servers) == 0)) || die "--size must be a multiple of 4 * --servers"

  launch "$BIN" "$servers" "$workers" "$seconds" \
    --size "$size" --window "$window" --seconds "$seconds"

  python3 - "$LOGS" "$size" "$servers" "$workers" "$window" <<'EOF'
import glob, json, statistics, sys
logs, size, servers, workers, window = sys.argv[1], *map(int, sys.argv[2:])
rows = []
for path in glob.glob(logs + "/*.out"):
    for line in open(path):
        if line.startswith("PSLITE_RESULT "):
            rows.append(json.loads(line.split(" ", 1)[1]))
for op in ("push", "pull"):
    mine = [r for r in rows if r["op"] == op]
    ws = [r for r in mine if r["role"] == "worker"]
    assert len(ws) == workers and len(mine) == 1 + servers + workers, mine
    ops = sum(r["ops"] for r in ws)
    secs = max(r["secs"] for r in ws)
    cpu = sum(r["cpu_s"] for r in mine)
    print(json.dumps({
        "system": "ps-lite", "mode": op, "size_bytes": size,
        "servers": servers, "workers": workers, "window": window,
        "rpcs_per_sec": round(ops / secs, 1),
        "p50_us": round(statistics.median(r["p50_us"] for r in ws), 1),
        "p99_us": round(statistics.median(r["p99_us"] for r in ws), 1),
        "cpu_us_per_op": round(cpu / ops * 1e6, 1),
    }))
EOF
}

run_rows() {
  local servers=1 workers=1 batch=4096 width=64 rows=10000000 zipf=1.05 window=4 seconds=3
  while (($#)); do
    (($# >= 2)) || die "$1 needs a value"
    case "$1" in
      --servers) servers=$2 ;;
      --workers) workers=$2 ;;
      --batch) batch=$2 ;;
      --width) width=$2 ;;
      --rows) rows=$2 ;;
      --zipf) zipf=$2 ;;
      --window) window=$2 ;;
      --seconds) seconds=$2 ;;
      *) die "unknown flag $1 (run-rows [--servers S] [--workers W] [--batch B] [--width D] [--rows N] [--zipf A] [--window K] [--seconds N])" ;;
    esac
    shift 2
  done
  [[ -x "$ROWS_BIN" ]] || die "no $ROWS_BIN: run '$0 build' first"
  launch "$ROWS_BIN" "$servers" "$workers" "$seconds" \
    --batch "$batch" --width "$width" --rows "$rows" --zipf "$zipf" \
    --window "$window" --seconds "$seconds"

  python3 - "$LOGS" "$servers" "$workers" "$window" "$batch" "$width" <<'EOF'
import glob, json, statistics, sys
logs, servers, workers, window, batch, width = sys.argv[1], *map(int, sys.argv[2:])
rows = []
for path in glob.glob(logs + "/*.out"):
    for line in open(path):
        if line.startswith("PSLITE_RESULT "):
            rows.append(json.loads(line.split(" ", 1)[1]))
for op in ("push", "pull"):
    mine = [r for r in rows if r["op"] == op]
    ws = [r for r in mine if r["role"] == "worker"]
    assert len(ws) == workers and len(mine) == 1 + servers + workers, mine
    moved = sum(r["rows"] for r in ws)
    secs = max(r["secs"] for r in ws)
    server_cpu = sum(r["cpu_s"] for r in mine if r["role"] == "server")
    print(json.dumps({
        "system": "ps-lite", "mode": op, "batch": batch, "width": width,
        "servers": servers, "workers": workers, "window": window,
        "rows_per_sec": round(moved / secs),
        "mb_per_sec": round(moved * width * 4 / secs / 1e6, 1),
        "rows_per_batch": round(moved / max(1, sum(r["batches"] for r in ws)), 1),
        "p50_us": round(statistics.median(r["p50_us"] for r in ws), 1),
        "p99_us": round(statistics.median(r["p99_us"] for r in ws), 1),
        "server_cpu_us_per_row": round(server_cpu / moved * 1e6, 3),
    }))
EOF
}

case "${1:-}" in
  build) build ;;
  run) shift; run "$@" ;;
  run-rows) shift; run_rows "$@" ;;
  *) sed -n '2,28p' "$0" | sed 's/^# \{0,1\}//' >&2; exit 2 ;;
esac
