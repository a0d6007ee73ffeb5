#!/usr/bin/env bash
# The second device call of stop 57, with target/gpu-carry carried: 4 KiB
# operations through shared memory on the 16-core host, with each process's
# runtime at its default size (half the cores: 8 threads) and at 1 and 2
# threads (PS_RUNTIME_THREADS sizes kv's own runtime and the servers it starts).
set -u
OUT=${OUT:?the device run names \$OUT}
work=$(mktemp -d)
python3 -c 'import sys, tarfile; tarfile.open(sys.argv[1], "r:xz").extractall(sys.argv[2])' \
    target/gpu-carry/programs.tar.xz "$work"
for threads in default 1 2; do
    for shape in 1x1 2x2 4x4; do
        if [ "$threads" = default ]; then unset PS_RUNTIME_THREADS; else export PS_RUNTIME_THREADS=$threads; fi
        timeout 60 "$work/bin/ps-microbench" kv --servers "${shape%x*}" --workers "${shape#*x}" \
            --sizes 4KiB --seconds 1 --data-path shm --json \
            >"$OUT/threads-$threads-$shape.json" 2>/dev/null
        echo "threads $threads $shape: exit $? at $SECONDS s"
    done
done
rm -rf "$work"
