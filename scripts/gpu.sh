#!/usr/bin/env bash
# The CUDA worker: built on a CPU machine with no GPU, carried to a GPU machine
# (no Rust toolchain, no network there) and checked there in one short run.
#
#   scripts/gpu.sh sdk            the pinned CUDA 13.0 wheels and link stubs -> target/cuda-sdk/
#   scripts/gpu.sh build          sdk if missing, ps-worker --features cuda -> target/cuda/,
#                                 its NEEDED libraries checked, packed -> target/gpu-carry/
#   scripts/gpu.sh cargo ARGS...  cargo with the SDK's settings (refuses without the SDK)
#   scripts/gpu.sh run [--device cuda:N] [--quick]
#                                 on the GPU machine, with target/gpu-carry carried: the
#                                 checks of docs/gpu.md, every figure as JSON into $OUT
#   scripts/gpu.sh run --dry-run [--quick]
#                                 the same checks on this machine's CPU programs
#                                 (target/release), --device cpu: tries the script
#
# Every step of `build` is resumable: the SDK, the stubs and cargo's own target
# folder are kept, so running it again picks up where it stopped. docs/gpu.md says
# what each step does and what it measured.
set -euo pipefail

SCRIPT_DIR=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
ROOT=$(cd "$SCRIPT_DIR/.." && pwd)
SDK=${PS_CUDA_SDK:-$ROOT/target/cuda-sdk}
CUDA_ROOT=$SDK/nvidia/cu13
CUDA_TARGET=${PS_CUDA_TARGET:-$ROOT/target/cuda}
CARRY=${PS_GPU_CARRY:-$ROOT/target/gpu-carry}
# candle's MoE kernels are compiled to machine code for one architecture: 90 is
# Hopper (H100, H200), the cards this project is lent.
COMPUTE_CAP=${CUDA_COMPUTE_CAP:-90}
CARRY_LIMIT_MIB=60
# The worker's examples the run's scale-up check times on the GPU machine's CPUs.
SCALE_UP_EXAMPLES="single_process data_parallel"

# The wheels nvcc and the CUDA runtime come from, every one pinned to 13.0 (the GPU
# machine's driver is CUDA 13.0).
WHEELS=(
    nvidia-cuda-nvcc==13.0.88
    nvidia-nvvm==13.0.88
    nvidia-cuda-runtime==13.0.96
    nvidia-cuda-crt==13.0.88
    nvidia-cuda-cccl==13.0.85
)

# The libraries candle links and the soname each is loaded by on the GPU machine,
# as "cudarc-module soname": the stubs built here carry those sonames.
STUBS=(
    "driver libcuda.so.1"
    "cublas libcublas.so.13"
    "cublaslt libcublasLt.so.13"
    "curand libcurand.so.10"
    "nvrtc libnvrtc.so.13"
)
# What the CUDA ps-worker must need, and nothing else from CUDA: the linker keeps
# only the libraries whose functions candle calls directly (cuBLASLt comes in
# through cuBLAS; NVRTC is unused by the kernels candle ships compiled).
CUDA_NEEDED="libcublas.so.13 libcuda.so.1 libcudart.so.13 libcurand.so.10"

say() { printf 'gpu.sh: %s\n' "$*" >&2; }
die() {
    say "$*"
    exit 1
}

usage() {
    sed -n '2,18p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//'
}

# ---------------------------------------------------------------- the SDK --

sdk_present() { [ -x "$CUDA_ROOT/bin/nvcc" ] && [ -f "$SDK/.stubs-done" ]; }

require_sdk() {
    sdk_present || die "no CUDA SDK under $SDK: run \`scripts/gpu.sh sdk\` first (it installs the pinned CUDA 13.0 wheels there; nothing outside target/ changes)"
}

install_wheels() {
    if [ -f "$SDK/.wheels-done" ]; then
        say "wheels: present in $SDK"
        return
    fi
    say "wheels: installing ${WHEELS[*]} into $SDK"
    command -v python3 >/dev/null || die "python3 is needed to install the CUDA wheels"
    mkdir -p "$SDK"
    PIP_ROOT_USER_ACTION=ignore python3 -m pip install --quiet --disable-pip-version-check --no-deps \
        --target "$SDK" --upgrade "${WHEELS[@]}"
    [ -x "$CUDA_ROOT/bin/nvcc" ] || die "the wheels installed, but $CUDA_ROOT/bin/nvcc is missing"
    # The runtime wheel has only the versioned library; candle's kernels link -lcudart.
    ln -sf libcudart.so.13 "$CUDA_ROOT/lib/libcudart.so"
    # cudaforge derives <root>/lib64 from nvcc's place.
    ln -sfn lib "$CUDA_ROOT/lib64"
    touch "$SDK/.wheels-done"
}

# The cudarc sources cargo fetched, for its function lists.
cudarc_dir() {
    local version registry
    version=$(awk '/^name = "cudarc"$/ { getline; gsub(/[^0-9.]/, ""); print; exit }' "$ROOT/Cargo.lock")
    [ -n "$version" ] || die "Cargo.lock names no cudarc"
    (cd "$ROOT" && cargo fetch --locked --quiet)
    for registry in "${CARGO_HOME:-$HOME/.cargo}"/registry/src/*/; do
        if [ -d "$registry/cudarc-$version" ]; then
            printf '%s\n' "$registry/cudarc-$version"
            return
        fi
    done
    die "cargo fetched no cudarc-$version"
}

# One stub library per CUDA library candle links: every function cudarc declares
# for it, as an empty symbol, under the real library's soname. The link needs
# nothing more; on the GPU machine the real libraries are loaded by that soname.
build_stubs() {
    if [ -f "$SDK/.stubs-done" ]; then
        say "stubs: present in $CUDA_ROOT/lib/stubs"
        return
    fi
    local cudarc stubs entry module soname source
    cudarc=$(cudarc_dir)
    stubs=$CUDA_ROOT/lib/stubs
    mkdir -p "$stubs"
    for entry in "${STUBS[@]}"; do
        read -r module soname <<<"$entry"
        source=$stubs/${soname%%.so*}.c
        grep -ohE '^pub unsafe fn [A-Za-z_][A-Za-z0-9_]*' "$cudarc/src/$module/sys/"*.rs |
            awk '{ print $4 }' | sort -u | sed 's/.*/void &(void) {}/' >"$source"
        [ -s "$source" ] || die "cudarc's $module lists no functions"
        gcc -shared -fPIC -o "$stubs/${soname%%.so*}.so" -Wl,-soname,"$soname" "$source"
        say "stubs: ${soname%%.so*}.so ($soname, $(wc -l <"$source") functions)"
    done
    touch "$SDK/.stubs-done"
}

cmd_sdk() {
    install_wheels
    build_stubs
    say "sdk: $("$CUDA_ROOT/bin/nvcc" --version | tail -2 | head -1)"
}

# ------------------------------------------------------------- the build --

cuda_env() {
    export CUDA_HOME=$CUDA_ROOT
    export PATH=$CUDA_ROOT/bin:$PATH
    export CUDARC_CUDA_VERSION=13000
    export CUDA_COMPUTE_CAP=$COMPUTE_CAP
    export CARGO_TARGET_DIR=$CUDA_TARGET
}

cmd_cargo() {
    require_sdk
    cuda_env
    cd "$ROOT" && cargo "$@"
}

# The CUDA libraries a binary needs, sorted, one line.
cuda_needed() {
    readelf -d "$1" | sed -n 's/.*(NEEDED).*\[\(.*\)\]/\1/p' |
        { grep -E '^lib(cu|nvrtc)' || true; } | sort | tr '\n' ' ' | sed 's/ $//'
}

# The worker needs exactly the CUDA libraries candle uses, and none of them can be
# loaded on this machine (the stubs carry other file names), so no check here can
# pass by running CUDA code that is not there.
check_worker() {
    local worker=$1 needed resolved lib
    needed=$(cuda_needed "$worker")
    [ "$needed" = "$CUDA_NEEDED" ] ||
        die "$worker needs CUDA libraries [$needed], expected [$CUDA_NEEDED]"
    resolved=$(ldd "$worker")
    for lib in $CUDA_NEEDED; do
        grep -q "^[[:space:]]*$lib => not found" <<<"$resolved" ||
            die "$lib resolves on this machine; the carried worker must load the GPU machine's (and the carried runtime)"
    done
    say "check: NEEDED [$needed], none of them loadable here, as expected"
}

cmd_build() {
    local started=$SECONDS
    cmd_sdk
    cuda_env
    say "build: ps-worker --features cuda into $CUDA_TARGET (candle's kernels take tens of minutes on 2 cores the first time)"
    (cd "$ROOT" && cargo build --release --locked -p ps-worker --features cuda)
    say "build: ps-server, ps-microbench, ps-local and the worker's examples (CPU) into $ROOT/target/release"
    (cd "$ROOT" && env -u CARGO_TARGET_DIR -u CUDA_HOME -u CUDARC_CUDA_VERSION -u CUDA_COMPUTE_CAP \
        cargo build --release --locked -p ps-server --bin ps-server -p ps-microbench --bin ps-microbench \
        -p ps-cluster --bin ps-local -p ps-worker --example single_process --example data_parallel)
    check_worker "$CUDA_TARGET/release/ps-worker"
    pack
    say "build: done in $((SECONDS - started)) s"
}

# target/gpu-carry/: gpu.sh and one compressed archive of the stripped programs and
# the CUDA runtime, under CARRY_LIMIT_MIB.
pack() {
    local stage=$CARRY/stage size_mib
    rm -rf "$CARRY"
    mkdir -p "$stage/bin" "$stage/lib"
    strip -o "$stage/bin/ps-worker" "$CUDA_TARGET/release/ps-worker"
    strip -o "$stage/bin/ps-server" "$ROOT/target/release/ps-server"
    strip -o "$stage/bin/ps-microbench" "$ROOT/target/release/ps-microbench"
    # The CPU programs of the run's scale-up check (g).
    strip -o "$stage/bin/ps-local" "$ROOT/target/release/ps-local"
    local example
    for example in $SCALE_UP_EXAMPLES; do
        strip -o "$stage/bin/$example" "$ROOT/target/release/examples/$example"
    done
    cp -L "$CUDA_ROOT/lib/libcudart.so.13" "$stage/lib/"
    say "pack: compressing $(du -sh "$stage" | cut -f1) of programs"
    tar -C "$stage" -cf - bin lib | xz -T0 -6 >"$CARRY/programs.tar.xz"
    rm -rf "$stage"
    cp "$SCRIPT_DIR/gpu.sh" "$SCRIPT_DIR/gpu_run.py" "$CARRY/"
    size_mib=$(($(du -sb "$CARRY" | cut -f1) / 1048576))
    say "pack: $CARRY is $(du -sh "$CARRY" | cut -f1) (limit ${CARRY_LIMIT_MIB} MiB)"
    [ "$size_mib" -lt "$CARRY_LIMIT_MIB" ] || die "the carry is over ${CARRY_LIMIT_MIB} MiB"
}

# --------------------------------------------------------------- the run --

cmd_run() {
    local device=cuda:0 quick=0 dry=0
    while [ $# -gt 0 ]; do
        case $1 in
        --device)
            [ $# -ge 2 ] || die "run: --device needs a value (cpu or cuda:N)"
            device=$2
            shift 2
            ;;
        --quick)
            quick=1
            shift
            ;;
        --dry-run)
            dry=1
            device=cpu
            shift
            ;;
        *) die "run: unknown flag $1 (use --device cpu|cuda:N, --quick, --dry-run)" ;;
        esac
    done
    local out=${OUT:-$ROOT/target/gpu-out}
    mkdir -p "$out"
    work=$(mktemp -d)
    trap 'rm -rf "$work"' EXIT
    if [ "$dry" = 1 ]; then
        # The same checks with this machine's CPU programs, to try the script.
        local release=${PS_GPU_PROGRAMS:-$ROOT/target/release}
        { [ -x "$release/ps-worker" ] && [ -x "$release/ps-server" ]; } ||
            die "no ps-worker and ps-server in $release: run \`cargo build --release -p ps-worker -p ps-server\` first"
        mkdir -p "$work/bin" "$work/lib"
        ln -s "$release/ps-worker" "$release/ps-server" "$work/bin/"
        # The scale-up check's programs, where they were built.
        local program
        for program in "$release/ps-local" "$release/examples/single_process" "$release/examples/data_parallel"; do
            if [ -x "$program" ]; then ln -s "$program" "$work/bin/"; fi
        done
    else
        local carried=$CARRY
        # gpu.sh run from inside the carried folder finds the archive beside itself.
        [ -f "$SCRIPT_DIR/programs.tar.xz" ] && carried=$SCRIPT_DIR
        [ -f "$carried/programs.tar.xz" ] ||
            die "no $carried/programs.tar.xz: run \`scripts/gpu.sh build\` on a CPU machine and carry target/gpu-carry"
        # Python's tarfile reads xz where the xz program is not installed.
        python3 -c 'import sys, tarfile; tarfile.open(sys.argv[1], "r:xz").extractall(sys.argv[2])' \
            "$carried/programs.tar.xz" "$work"
    fi
    local status=0
    PS_GPU_WORK=$work PS_GPU_OUT=$out PS_GPU_DEVICE=$device PS_GPU_QUICK=$quick \
        python3 "$SCRIPT_DIR/gpu_run.py" || status=$?
    # The programs' logs in one archive beside gpu.json: a device run hands back
    # only a few files from its $OUT.
    (cd "$out" && shopt -s nullglob && logs=(*.log) &&
        if [ ${#logs[@]} -gt 0 ]; then tar -czf logs.tgz "${logs[@]}" && rm -f "${logs[@]}"; fi) ||
        say "could not archive the logs in $out; they are left as they are"
    return "$status"
}

case ${1:-} in
sdk) cmd_sdk ;;
build) cmd_build ;;
cargo)
    shift
    cmd_cargo "$@"
    ;;
run)
    shift
    cmd_run "$@"
    ;;
-h | --help | help) usage ;;
*)
    usage >&2
    exit 2
    ;;
esac
