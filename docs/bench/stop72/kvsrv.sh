#!/bin/bash
# kv's 4 KiB rows at 2x2 with PS_RUNTIME_THREADS set for the servers only:
# kv starts the ps-server next to it, here a wrapper that sets the variable
# from SRV_THREADS and runs the real one. Interleaved rounds of 1 and 2.
# Usage: kvsrv.sh BUILD_DIR OUT ROUNDS
set -u
B=$1; OUT=$2; N=$3; BIN=$(mktemp -d)
cp "$B"/{ps-microbench,ps-worker} "$BIN"/ && cp "$B/ps-server" "$BIN/ps-server.real"
printf '#!/bin/sh\nPS_RUNTIME_THREADS=${SRV_THREADS:-1} exec %s/ps-server.real "$@"\n' "$BIN" > "$BIN/ps-server"
chmod +x "$BIN/ps-server"
mkdir -p "$OUT"
for r in $(seq 1 $N); do
  for t in 1 2; do
    SRV_THREADS=$t "$BIN/ps-microbench" kv --servers 2 --workers 2 --sizes 4KiB --seconds 2 \
      --data-path grpc,shm --json 2>/dev/null > "$OUT/kvsrv-t$t-r$r.json"
  done
done
rm -rf "$BIN"
