#!/usr/bin/env bash
# The local docker-compose cluster of candle-ps, with no image registry needed.
#
#   scripts/cluster.sh build          static binaries (checked with ldd) -> target/docker/bin, then images
#   scripts/cluster.sh up [ARGS...]   build, then `compose up` a new job (ARGS go to compose, e.g. --scale worker=4)
#                                     and follow its logs until it is done; Prometheus stays up with its metrics.
#                                     PS_JOB_ID=ID resumes job ID when it has not finished
#   scripts/cluster.sh up --plan FILE [ARGS...]
#                                     the same, with the setup a plan file chose (`ps-scheduler plan --out`):
#                                     its servers, consistency, pipelining, backward segments and wire dtype
#   scripts/cluster.sh down           stop and remove containers, network and volumes
#   scripts/cluster.sh compose ARGS   any other compose command on this project
#
# PS_BUILD_PROFILE picks the cargo profile of the binaries (default release).
# PS_BINARIES=DIR builds nothing: the images take the binaries already in DIR
# (CI passes target/debug, which `cargo test --workspace` has just built), each
# with the shared libraries it links (ldd), so the compose and swarm steps test
# the same code without compiling the workspace a second time.
#
# Works with `docker compose` (v2) and `docker-compose` (v1.28+).
set -euo pipefail
cd "$(dirname "$0")/.."

TARGET=x86_64-unknown-linux-gnu
BINARIES=(ps-scheduler ps-server ps-worker ps-microbench)
STAGE=target/docker
PROFILE=${PS_BUILD_PROFILE:-release}

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

# Copies the shared libraries ldd finds for binary $1 (the C library and the
# loader, at the paths the binary names) under the root folder $2.
copy_linked_libraries() {
    local lib
    for lib in $(ldd "$1" 2>/dev/null | grep -o '/[^ ]*'); do
        cp --parents -L "$lib" "$2/"
    done
}

# The binaries of the images, stripped, in $STAGE/bin: fully static ones built
# here (the images start FROM scratch, with no libc), or with PS_BINARIES those
# already built there, each with the libraries it links in $STAGE/libs (the
# image's root). Nothing is compiled then.
build_binaries() {
    local from bin built linked
    if [ -n "${PS_BINARIES:-}" ]; then
        echo "==> staging the binaries built in $PS_BINARIES (nothing is compiled)"
        from=$PS_BINARIES
    else
        echo "==> building static $PROFILE binaries for $TARGET"
        local selected=()
        for bin in "${BINARIES[@]}"; do
            selected+=(--bin "$bin")
        done
        RUSTFLAGS="${RUSTFLAGS:-} -C target-feature=+crt-static" \
            cargo build --profile "$PROFILE" --locked --target "$TARGET" "${selected[@]}"
        # cargo puts the dev profile's output under debug/, every other under its name.
        from=target/$TARGET/$PROFILE
        if [ "$PROFILE" = dev ]; then
            from=target/$TARGET/debug
        fi
    fi
    rm -rf "$STAGE"
    # The image's /var/lib/candle-ps is an empty folder owned by the unprivileged
    # user: Docker gives a new named volume its ownership. Nothing is inside it,
    # because Docker copies an image's files into a new volume once per container
    # and two servers created at once race on each folder ("mkdir ... file
    # exists"); the programs create their folders themselves.
    mkdir -p "$STAGE/bin" "$STAGE/state" "$STAGE/libs"
    for bin in "${BINARIES[@]}"; do
        built="$from/$bin"
        if [ ! -x "$built" ]; then
            echo "cluster.sh: $built is missing; build it first (cargo build --workspace --bins)" >&2
            exit 1
        fi
        # ldd says "statically linked" or "not a dynamic executable" for static
        # binaries, and lists shared libraries otherwise.
        linked=static
        if ldd "$built" 2>&1 | grep -q '=>'; then
            if [ -z "${PS_BINARIES:-}" ]; then
                echo "cluster.sh: $built is dynamically linked; it cannot run FROM scratch" >&2
                ldd "$built" >&2
                exit 1
            fi
            linked="linked"
            copy_linked_libraries "$built" "$STAGE/libs"
        fi
        cp "$built" "$STAGE/bin/$bin"
        strip "$STAGE/bin/$bin" 2>/dev/null || true
        printf '    %-14s %s, %s\n' "$bin" "$linked" "$(du -h "$STAGE/bin/$bin" | cut -f1)"
    done
    if [ -n "${PS_BINARIES:-}" ]; then
        printf '    %-14s %s\n' "libraries" "$(cd "$STAGE/libs" && find . -type f | sed 's|^\.||' | tr '\n' ' ')"
    fi
}

# Debian's prometheus, installed here when it is not (as root, with apt-get).
need_prometheus() {
    if [ -x /usr/bin/prometheus ]; then
        return 0
    fi
    if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
        echo "==> installing Debian's prometheus package (for the Prometheus image)"
        (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends prometheus) >/dev/null
    fi
    if [ ! -x /usr/bin/prometheus ]; then
        echo "cluster.sh: the Prometheus image needs Debian's prometheus package: sudo apt-get install prometheus" >&2
        exit 1
    fi
}

# The Prometheus image's files: Debian's binary and the shared libraries it
# links (only the C library), its web assets with their symlinks into other
# packages followed (leaving out moment-timezone's 200 MB of raw zone data,
# which the UI does not load) and deploy/prometheus's configuration.
stage_prometheus() {
    need_prometheus
    local root="$STAGE/prometheus"
    rm -rf "$root"
    mkdir -p "$root/usr/bin" "$root/usr/share/prometheus" "$root/etc/prometheus"
    cp /usr/bin/prometheus "$root/usr/bin/"
    copy_linked_libraries /usr/bin/prometheus "$root"
    tar -chf - --exclude='web/static/moment-timezone/data' -C /usr/share/prometheus web |
        tar -xf - -C "$root/usr/share/prometheus"
    cp deploy/prometheus/prometheus.yml deploy/prometheus/rules.yml "$root/etc/prometheus/"
    printf '    %-14s Debian %s, %s with its web assets\n' prometheus \
        "$(/usr/bin/prometheus --version 2>&1 | awk 'NR == 1 { print $3 }')" "$(du -sh "$root" | cut -f1)"
}

build() {
    build_binaries
    stage_prometheus
    echo "==> building images"
    compose --profile bench build
}

# Each `up` is a job of its own: the scheduler's state and the servers' checkpoints
# live under its id, so a new job never resumes a finished one or starts from its
# weights. PS_JOB_ID=ID resumes job ID explicitly.
choose_job() {
    if [ -z "${PS_JOB_ID:-}" ]; then
        PS_JOB_ID="job-$(date -u +%Y%m%d-%H%M%S)"
        echo "==> new job $PS_JOB_ID (to resume it if it stops early: PS_JOB_ID=$PS_JOB_ID scripts/cluster.sh up)"
    elif ! [[ "$PS_JOB_ID" =~ ^[A-Za-z0-9._-]+$ ]]; then
        echo "cluster.sh: PS_JOB_ID may hold only letters, digits, '.', '_' and '-'; got '$PS_JOB_ID'" >&2
        exit 2
    else
        echo "==> job $PS_JOB_ID: resumed where it stopped, unless it has finished (then the scheduler says so)"
    fi
    export PS_JOB_ID
}

# Exports the variables of the setup plan file $1 chose (PS_SERVERS,
# PS_CONSISTENCY, PS_NO_PIPELINE, PS_BACKWARD_SEGMENTS, PS_WIRE_DTYPE,
# PS_PARTITION_BYTES, PS_REQUESTS_PER_SERVER), as
# `ps-scheduler plan-env` prints them; the compose file passes them on.
apply_plan() {
    local env name value
    env=$("$STAGE/bin/ps-scheduler" plan-env "$1") || exit
    echo "==> the plan's setup ($1): ${env//$'\n'/ }"
    while IFS='=' read -r name value; do
        export "$name=$value"
    done <<<"$env"
}

# The job's services; Prometheus (and the bench profile) stay up after them.
JOB_SERVICES=(certs scheduler server worker)

# Follows the job's logs until every one of its containers has stopped; Ctrl-C
# stops the job (SIGTERM, then SIGKILL after the grace period).
follow_job() {
    compose logs -f --tail=all "${JOB_SERVICES[@]}" &
    local logs=$!
    trap 'echo; echo "==> stopping job $PS_JOB_ID"; compose stop "${JOB_SERVICES[@]}"; kill "$logs" 2>/dev/null; exit 130' INT TERM
    local id status running=1
    while [ "$running" = 1 ]; do
        sleep 1
        running=0
        for id in $(compose ps -a -q "${JOB_SERVICES[@]}"); do
            status=$(docker inspect -f '{{.State.Status}}' "$id" 2>/dev/null || echo gone)
            case "$status" in exited | dead | gone) ;; *) running=1 ;; esac
        done
    done
    trap - INT TERM
    kill "$logs" 2>/dev/null || true
    wait "$logs" 2>/dev/null || true
}

# After the job's containers stop: names every container that exited with an error,
# and fails when one did, so a cluster that could not train does not look done.
report_exits() {
    local failed=0 id name code
    for id in $(compose ps -a -q "${JOB_SERVICES[@]}"); do
        read -r name code < <(docker inspect -f '{{.Name}} {{.State.ExitCode}}' "$id")
        if [ "$code" != 0 ]; then
            echo "cluster.sh: ${name#/} exited with code $code; its log: docker logs ${name#/}" >&2
            failed=1
        fi
    done
    if [ "$failed" = 0 ]; then
        echo "==> job $PS_JOB_ID done: every container exited 0"
    fi
    return "$failed"
}

case "${1:-up}" in
    build) build ;;
    up)
        shift || true
        plan=""
        if [ "${1:-}" = --plan ]; then
            plan=${2:?cluster.sh: --plan needs a plan file}
            [ -f "$plan" ] || { echo "cluster.sh: no plan file at $plan" >&2; exit 2; }
            shift 2
        fi
        choose_job
        build
        if [ -n "$plan" ]; then
            apply_plan "$plan"
            set -- --scale "server=$PS_SERVERS" "$@"
        fi
        echo "==> starting job $PS_JOB_ID (Ctrl-C stops it; \`scripts/cluster.sh down\` removes it)"
        compose up -d "$@" || exit
        echo "==> Prometheus: http://$(compose port prometheus 9090 2>/dev/null || echo 127.0.0.1:9090)"
        follow_job
        report_exits || exit
        echo "==> Prometheus keeps the job's metrics until \`scripts/cluster.sh down\`"
        ;;
    down) compose --profile bench down -v --remove-orphans ;;
    compose)
        shift
        compose "$@"
        ;;
    *)
        sed -n '2,11p' "$0" >&2
        exit 2
        ;;
esac
