#!/bin/bash
# The changes tried and not kept, as interleaved rounds of procs.sh over
# shared memory (300 epochs) on a scratch build of scratch-wait.patch, whose
# waits read their limits from the environment:
#   PS_SCRATCH_REQ_SPIN_US   how long a server spins for a request (200)
#   PS_SCRATCH_ANS_SPIN_US   how long a worker spins for an answer (200)
#   PS_SCRATCH_LONG_YIELD_US a system yield longer than this ends the spin,
#                            and the next PS_SCRATCH_SKIP waits sleep at once
# and PS_RUNTIME_THREADS=2 for the servers (SRV_ENV); then ps-local with its
# workers' compute in tokio's block_in_place (PS_SCRATCH_BIP).
# Usage: tried.sh SCRATCH_BUILD_DIR OUT ROUNDS
set -u
B=$1; OUT=$2; N=$3; HERE=$(dirname "$0")
mkdir -p "$OUT"
configs=(base:X=1 reqspin10:PS_SCRATCH_REQ_SPIN_US=10 reqspin0:PS_SCRATCH_REQ_SPIN_US=0
         ansspin0:PS_SCRATCH_ANS_SPIN_US=0 longyield20:PS_SCRATCH_LONG_YIELD_US=20,PS_SCRATCH_SKIP=1)
for r in $(seq 1 $N); do
  for c in "${configs[@]}"; do
    name=${c%%:*}; vars=${c#*:}
    env ${vars//,/ } "$HERE/procs.sh" "$B" shm 300 "$OUT/$name-r$r"
  done
  SRV_ENV=PS_RUNTIME_THREADS=2 "$HERE/procs.sh" "$B" shm 300 "$OUT/srvthreads2-r$r"
  for p in grpc shm; do
    "$B/ps-local" --json --epochs 300 --data-path $p 2>/dev/null | tail -1 > "$OUT/local-$p-r$r.json"
    PS_SCRATCH_BIP=1 "$B/ps-local" --json --epochs 300 --data-path $p 2>/dev/null | tail -1 > "$OUT/localbip-$p-r$r.json"
  done
done
