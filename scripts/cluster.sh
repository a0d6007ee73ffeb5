#!/usr/bin/env bash
# The local docker-compose cluster of candle-ps, with no image registry needed.
#
#   scripts/cluster.sh build          static binaries (checked with ldd) -> target/docker/bin, then images
#   scripts/cluster.sh up [ARGS...]   build, then `compose up` (ARGS go to compose, e.g. --scale worker=4)
#   scripts/cluster.sh down           stop and remove containers, network and volumes
#   scripts/cluster.sh compose ARGS   any other compose command on this project
#
# Works with `docker compose` (v2) and `docker-compose` (v1.28+).
set -euo pipefail
cd "$(dirname "$0")/.."

TARGET=x86_64-unknown-linux-gnu
BINARIES=(ps-scheduler ps-server ps-worker ps-microbench)
STAGE=target/docker

compose() {
    if docker compose version >/dev/null 2>&1; then
        docker compose "$@"
    elif command -v docker-compose >/dev/null; then
        docker-compose "$@"
    else
        echo "cluster.sh: neither \`docker compose\` nor \`docker-compose\` is installed" >&2
        exit 1
    fi
}

# Fully static release binaries: the images start FROM scratch, with no libc.
build_binaries() {
    echo "==> building static release binaries for $TARGET"
    RUSTFLAGS="${RUSTFLAGS:-} -C target-feature=+crt-static" \
        cargo build --release --locked --target "$TARGET" $(printf -- '--bin %s ' "${BINARIES[@]}")
    rm -rf "$STAGE"
    mkdir -p "$STAGE/bin" "$STAGE/state/checkpoints"
    for bin in "${BINARIES[@]}"; do
        local built="target/$TARGET/release/$bin"
        # ldd says "statically linked" or "not a dynamic executable" for static
        # binaries, and lists shared libraries otherwise.
        if ldd "$built" 2>&1 | grep -q '=>'; then
            echo "cluster.sh: $built is dynamically linked; it cannot run FROM scratch" >&2
            ldd "$built" >&2
            exit 1
        fi
        cp "$built" "$STAGE/bin/$bin"
        strip "$STAGE/bin/$bin" 2>/dev/null || true
        printf '    %-14s static, %s\n' "$bin" "$(du -h "$STAGE/bin/$bin" | cut -f1)"
    done
}

build() {
    build_binaries
    echo "==> building images"
    compose --profile bench build
}

case "${1:-up}" in
    build) build ;;
    up)
        shift || true
        build
        echo "==> starting the cluster (Ctrl-C stops it; \`scripts/cluster.sh down\` removes it)"
        compose up "$@"
        ;;
    down) compose --profile bench down -v --remove-orphans ;;
    compose)
        shift
        compose "$@"
        ;;
    *)
        sed -n '2,9p' "$0" >&2
        exit 2
        ;;
esac
