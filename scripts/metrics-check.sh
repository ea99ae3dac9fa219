#!/usr/bin/env bash
# Lints what a freshly started service exports: starts `stagedoor-checkout
# serve` on a throwaway database (local config, embedded Payrail sandbox, no
# demo seed) on a free port, scrapes GET /metrics once it is ready, and runs
# `promtool check metrics` on it; then stops the service with SIGTERM and
# drops the database. A fresh instance shows every series with known labels
# at zero (src/observe.rs), so this lints all of them, not only those that
# some traffic happened to touch.
#
#   scripts/metrics-check.sh            build the debug binary, then check
#   STAGEDOOR_BIN=path scripts/metrics-check.sh   check that binary instead
#   METRICS_CHECK_SAVE=file              also keeps the scrape in that file
#
# Installs promtool when missing (scripts/prometheus-tools.sh).
set -euo pipefail
cd "$(dirname "$0")/.."

export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-/var/tmp/stagedoor-target}"
promtool="$(scripts/prometheus-tools.sh)"

bin="${STAGEDOOR_BIN:-}"
if [ -z "$bin" ]; then
    cargo build --locked --bin stagedoor-checkout
    bin="$CARGO_TARGET_DIR/debug/stagedoor-checkout"
fi

db="stagedoor_mc_$$"
log="$(mktemp)"
scrape="$(mktemp)"
pid=""
cleanup() {
    local status=$?
    if [ -n "$pid" ] && kill -0 "$pid" 2>/dev/null; then
        kill -TERM "$pid" 2>/dev/null || true
        wait "$pid" 2>/dev/null || true
    fi
    if [ "$status" -ne 0 ] && [ -s "$log" ]; then
        echo "--- the service's log (last 40 lines)"
        tail -n 40 "$log"
    fi
    psql -h 127.0.0.1 -U postgres -qc "DROP DATABASE IF EXISTS \"$db\" WITH (FORCE)" >/dev/null 2>&1 || true
    rm -f "$log" "$scrape"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

# Databases of earlier runs that were killed (their process is gone).
psql -h 127.0.0.1 -U postgres -Atc "SELECT datname FROM pg_database WHERE datname LIKE 'stagedoor_mc_%'" \
    | while read -r old; do
        kill -0 "${old#stagedoor_mc_}" 2>/dev/null \
            || psql -h 127.0.0.1 -U postgres -qc "DROP DATABASE IF EXISTS \"$old\" WITH (FORCE)"
    done

port="$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')"
base="http://127.0.0.1:$port"
DATABASE_URL="postgres://postgres@127.0.0.1:5432/$db" \
    STAGEDOOR__SERVER__PORT="$port" \
    STAGEDOOR__DEMO__SEED=false \
    RUST_LOG="${RUST_LOG:-warn}" \
    "$bin" serve >"$log" 2>&1 &
pid=$!
ready_by=$((SECONDS + 60))
until curl -fsS -o /dev/null --max-time 2 "$base/readyz" 2>/dev/null; do
    kill -0 "$pid" 2>/dev/null || { echo "the service exited before it was ready" >&2; exit 1; }
    [ "$SECONDS" -lt "$ready_by" ] || { echo "the service was not ready on $base after 60 s" >&2; exit 1; }
    sleep 0.5
done

curl -fsS --max-time 10 "$base/metrics" >"$scrape"
[ -z "${METRICS_CHECK_SAVE:-}" ] || cp "$scrape" "$METRICS_CHECK_SAVE"
series="$(grep -vc '^#' "$scrape" || true)"
echo "scraped $base/metrics: $series lines of samples"
if ! lint="$("$promtool" check metrics <"$scrape" 2>&1)"; then
    echo "promtool check metrics failed:" >&2
    echo "$lint" >&2
    exit 1
fi
[ -z "$lint" ] || { echo "promtool check metrics:" >&2; echo "$lint" >&2; exit 1; }
echo "promtool check metrics: clean"

kill -TERM "$pid"
for _ in $(seq 1 45); do kill -0 "$pid" 2>/dev/null || break; sleep 1; done
if kill -0 "$pid" 2>/dev/null; then
    echo "the service was still running 45 s after SIGTERM" >&2
    exit 1
fi
status=0
wait "$pid" || status=$?
pid=""
if [ "$status" -ne 0 ]; then
    echo "the service exited with status $status after SIGTERM (expected 0)" >&2
    exit 1
fi
