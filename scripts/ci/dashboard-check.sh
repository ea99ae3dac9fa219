#!/usr/bin/env bash
# The dashboard (deploy/grafana/) against a real Prometheus scraping a live
# instance:
#   1. deploy/grafana/dashboard.py --check: the committed JSON is what the
#      code generates (Grafana Foundation SDK, scripts/ci/grafana-sdk.sh);
#   2. starts `stagedoor-checkout serve` on a throwaway database (local
#      config: embedded Payrail sandbox, the demo event) on a free port, and
#      Prometheus on another, scraping it every second;
#   3. drives a little traffic (holds, paid and declined orders, a replay, a
#      409 seat-unavailable);
#   4. runs every panel's expression, Grafana's variables substituted,
#      through Prometheus's /api/v1/query, and fails on an error or on an
#      empty result (scripts/ci/dashboard-check.py);
#   5. stops both and removes what they left.
#
#   scripts/ci/dashboard-check.sh            build the debug binary, then check
#   STAGEDOOR_BIN=path scripts/ci/dashboard-check.sh   check that binary instead
#
# Installs Prometheus (scripts/ci/prometheus-tools.sh) and the SDK when missing.
set -euo pipefail
cd "$(dirname "$0")/../.."

export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-/var/tmp/stagedoor-target}"
dashboard=deploy/grafana/dashboards/stagedoor-checkout.json

python="$(scripts/ci/grafana-sdk.sh)"
"$python" deploy/grafana/dashboard.py --check
echo "$dashboard: up to date with deploy/grafana/dashboard.py"

# The server comes in the same Debian package as promtool.
prometheus="$(dirname "$(scripts/ci/prometheus-tools.sh)")/prometheus"
[ -x "$prometheus" ] || { echo "no Prometheus server beside promtool: $prometheus" >&2; exit 1; }

bin="${STAGEDOOR_BIN:-}"
if [ -z "$bin" ]; then
    cargo build --locked --bin stagedoor-checkout
    bin="$CARGO_TARGET_DIR/debug/stagedoor-checkout"
fi

# shellcheck source=scripts/lib/throwaway-service.sh
. scripts/lib/throwaway-service.sh
prom_dir="$(mktemp -d)"
prom_pid=""
# The library's exit trap stops the service and drops its database; this
# one stops Prometheus first, then hands over to it.
dashboard_cleanup() {
    local status=$?
    set +e # to the end: a failed step here must not skip the service's cleanup
    if [ -n "$prom_pid" ] && kill -0 "$prom_pid" 2>/dev/null; then
        kill -TERM "$prom_pid" 2>/dev/null || true
        wait "$prom_pid" 2>/dev/null || true
    fi
    if [ "$status" -ne 0 ] && [ -s "$prom_dir/log" ]; then
        echo "--- Prometheus's log (last 20 lines)"
        tail -n 20 "$prom_dir/log"
    fi
    rm -rf "$prom_dir"
    (exit "$status") # the status the library's cleanup reads as its $?
    throwaway_cleanup
}
throwaway_service stagedoor_dash_ "$bin"
trap dashboard_cleanup EXIT

cat >"$prom_dir/prometheus.yml" <<EOF
global:
  scrape_interval: 1s
  evaluation_interval: 1s
scrape_configs:
  - job_name: stagedoor-checkout
    static_configs:
      - targets: ["${base#http://}"]
EOF
prom_port="$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')"
prom="http://127.0.0.1:$prom_port"
"$prometheus" --config.file="$prom_dir/prometheus.yml" --storage.tsdb.path="$prom_dir/data" \
    --web.listen-address="127.0.0.1:$prom_port" >"$prom_dir/log" 2>&1 &
prom_pid=$!
ready_by=$((SECONDS + 30))
until curl -fsS -o /dev/null --max-time 2 "$prom/-/ready" 2>/dev/null; do
    kill -0 "$prom_pid" 2>/dev/null || { echo "Prometheus exited before it was ready" >&2; exit 1; }
    [ "$SECONDS" -lt "$ready_by" ] || { echo "Prometheus was not ready on $prom after 30 s" >&2; exit 1; }
    sleep 0.5
done
echo "Prometheus $prom scraping $base/metrics every second"

token="$("$bin" token --sub "dashboard-$$")"
scripts/ci/dashboard-check.py traffic "$base" "$token" demo
scripts/ci/dashboard-check.py queries "$prom" "$dashboard"

kill -TERM "$prom_pid"
wait "$prom_pid" || { echo "Prometheus exited with status $? on SIGTERM" >&2; exit 1; }
prom_pid=""
stop_throwaway_service
