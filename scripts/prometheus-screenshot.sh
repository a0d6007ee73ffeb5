#!/usr/bin/env bash
# A screenshot of the compose cluster's Prometheus graph page showing the
# servers' push throughput during a real training job, taken by headless
# Chromium: the picture in docs/prometheus.png is made by this script.
#
#   scripts/prometheus-screenshot.sh [OUT.png]     default docs/prometheus.png
#
# Builds the images (scripts/cluster.sh build), runs a job of PS_EPOCHS (default
# 600) epochs in a compose project of its own, waits for it to finish, photographs
# the graph of the whole run, and removes the project. Needs a Docker engine and
# Debian's chromium (installed here when missing, as root with apt-get).
set -euo pipefail
cd "$(dirname "$0")/.."

OUT=${1:-docs/prometheus.png}
PROJECT=candle-ps-screenshot
export PS_EPOCHS=${PS_EPOCHS:-600}
export PS_JOB_ID=screenshot
export PS_PROMETHEUS_PUBLISH=127.0.0.1:

compose() { scripts/cluster.sh compose --project-name "$PROJECT" "$@"; }

browser() {
    local name
    for name in chromium chromium-browser google-chrome; do
        if command -v "$name" >/dev/null; then
            echo "$name"
            return
        fi
    done
    if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
        (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends chromium) >/dev/null
        echo chromium
        return
    fi
    echo "prometheus-screenshot.sh: needs chromium: sudo apt-get install chromium" >&2
    exit 1
}

# The job's containers have all stopped.
job_done() {
    local id
    for id in $(compose ps -a -q scheduler server worker); do
        case "$(docker inspect -f '{{.State.Status}}' "$id")" in exited | dead) ;; *) return 1 ;; esac
    done
}

BROWSER=$(browser)
scripts/cluster.sh build
trap 'compose down -v --remove-orphans -t 5 >/dev/null 2>&1 || true' EXIT
echo "==> training $PS_EPOCHS epochs with Prometheus watching"
compose up -d --no-build
PORT=$(compose port prometheus 9090 | cut -d: -f2)
started=$SECONDS
until job_done; do
    if ((SECONDS - started > 600)); then
        echo "prometheus-screenshot.sh: the job did not finish in 10 minutes" >&2
        compose logs --tail=40 >&2
        exit 1
    fi
    sleep 2
done
elapsed=$((SECONDS - started))
# One more scrape and rule evaluation after the last sample.
sleep 3

# The classic graph page: each server's push bytes per second over 10 s
# windows, over a range that holds the whole run.
expr='sum by (instance) (rate(candle_ps_server_push_bytes_total[10s]))'
encoded=$(python3 -c 'import sys, urllib.parse; print(urllib.parse.quote(sys.argv[1]))' "$expr")
range="$((elapsed + 15))s"
url="http://127.0.0.1:$PORT/graph?g0.expr=$encoded&g0.tab=0&g0.stacked=1&g0.range_input=$range"
echo "==> photographing $url"
mkdir -p "$(dirname "$OUT")"
"$BROWSER" --headless --no-sandbox --disable-gpu --hide-scrollbars \
    --window-size=1400,900 --virtual-time-budget=15000 \
    --screenshot="$OUT" "$url" 2>/dev/null
echo "==> wrote $OUT ($(du -h "$OUT" | cut -f1)) of a ${elapsed}s job"
