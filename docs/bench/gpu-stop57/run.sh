#!/usr/bin/env bash
# The one device call of stop 57 (an H200 machine, 16 cores), with target/gpu-carry
# carried: the run of docs/gpu.md (checks a-g), then `ps-microbench kv` on the
# host's CPUs at 1x1, 2x2 and 4x4 (the scale-up issue's small-operation and pull
# figures on more than two cores). Everything lands in $OUT.
set -u
OUT=${OUT:?the device run names \$OUT}
started=$SECONDS
bash target/gpu-carry/gpu.sh run
status=$?
echo "gpu.sh run: exit $status after $((SECONDS - started)) s" | tee "$OUT/run.txt"
work=$(mktemp -d)
python3 -c 'import sys, tarfile; tarfile.open(sys.argv[1], "r:xz").extractall(sys.argv[2])' \
    target/gpu-carry/programs.tar.xz "$work"
nproc >>"$OUT/run.txt"
for shape in 1x1 2x2 4x4; do
    servers=${shape%x*}
    workers=${shape#*x}
    timeout 150 "$work/bin/ps-microbench" kv --servers "$servers" --workers "$workers" \
        --sizes 4KiB,1MiB,16MiB --seconds 2 --data-path grpc,shm --sgd-floor --json \
        >"$OUT/kv-$shape.json" 2>"$OUT/kv-$shape.err"
    echo "kv $shape: exit $? at $((SECONDS - started)) s" | tee -a "$OUT/run.txt"
done
rm -rf "$work"
exit "$status"
