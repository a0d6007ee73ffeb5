#!/usr/bin/env bash
# Runs one test file of the workspace again and again, and counts the failures:
# the way to show that a concurrency fix holds, or to catch a flaky test.
#
#   scripts/stress.sh TEST [RUNS] [-- TEST-ARGS...]
#   scripts/stress.sh chaos 20                       tests/tests/chaos.rs, 20 times
#   scripts/stress.sh chaos 10 -- a_worker_killed    only the tests matching a filter
#
# TEST is an integration-test file (its name without .rs) of any package; the
# package is found by where the file lives. Each failed run's whole output is kept
# in target/stress/TEST-RUN.log; the script exits non-zero when any run failed.
set -uo pipefail
cd "$(dirname "$0")/.."

if [ $# -lt 1 ] || [ "$1" = -h ] || [ "$1" = --help ]; then
    sed -n '2,11p' "$0" | sed 's/^# \{0,1\}//'
    exit 2
fi
test_name=$1
runs=${2:-20}
shift $(( $# >= 2 ? 2 : 1 ))
[ "${1:-}" = -- ] && shift
if ! [[ "$runs" =~ ^[1-9][0-9]*$ ]]; then
    echo "stress.sh: RUNS must be a positive whole number, got '$runs'" >&2
    exit 2
fi

file=$(find . -path ./target -prune -o -path "*/tests/$test_name.rs" -print | head -n 1)
if [ -z "$file" ]; then
    echo "stress.sh: no integration-test file named $test_name.rs in any package's tests/ folder" >&2
    exit 2
fi
package=$(sed -n 's/^name = "\(.*\)"/\1/p' "$(dirname "$(dirname "$file")")/Cargo.toml" | head -n 1)

# The end-to-end tests start the workspace's binaries as processes: build them too.
echo "==> building the workspace's binaries and $package --test $test_name"
cargo build --workspace --bins --quiet || exit 1
cargo test -p "$package" --test "$test_name" --no-run --quiet || exit 1

mkdir -p target/stress
passed=0
failures=0
for run in $(seq 1 "$runs"); do
    log="target/stress/$test_name-$run.log"
    started=$SECONDS
    if cargo test -p "$package" --test "$test_name" --quiet -- "$@" >"$log" 2>&1; then
        passed=$((passed + 1))
        printf 'run %2d/%d: passed (%d s)\n' "$run" "$runs" $((SECONDS - started))
        rm -f "$log"
    else
        failures=$((failures + 1))
        printf 'run %2d/%d: FAILED (%d s), output in %s\n' "$run" "$runs" $((SECONDS - started)) "$log"
        grep -E '^test .* FAILED|panicked at|^---- ' "$log" | head -n 5 | sed 's/^/    /'
    fi
done
echo "$test_name: $passed passed, $failures failed"
[ "$failures" -eq 0 ]
