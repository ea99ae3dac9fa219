#!/usr/bin/env bash
# Lints what a freshly started service exports: starts `stagedoor-checkout
# serve` on a throwaway database (local config, embedded Payrail sandbox, no
# demo seed) on a free port, scrapes GET /metrics once it is ready, and runs
# `promtool check metrics` on it; then stops the service with SIGTERM and
# drops the database. A fresh instance shows every series with known labels
# at zero (src/observe.rs), so this lints all of them, not only those that
# some traffic happened to touch.
#
#   scripts/ci/metrics-check.sh            build the debug binary, then check
#   STAGEDOOR_BIN=path scripts/ci/metrics-check.sh   check that binary instead
#   METRICS_CHECK_SAVE=file              also keeps the scrape in that file
#
# Installs promtool when missing (scripts/ci/prometheus-tools.sh).
set -euo pipefail
cd "$(dirname "$0")/../.."

export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-/var/tmp/stagedoor-target}"
promtool="$(scripts/ci/prometheus-tools.sh)"

bin="${STAGEDOOR_BIN:-}"
if [ -z "$bin" ]; then
    cargo build --locked --bin stagedoor-checkout
    bin="$CARGO_TARGET_DIR/debug/stagedoor-checkout"
fi

# shellcheck source=scripts/lib/throwaway-service.sh
. scripts/lib/throwaway-service.sh
scrape="$(mktemp)"
throwaway_files+=("$scrape")
throwaway_service stagedoor_mc_ "$bin" STAGEDOOR__DEMO__SEED=false

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

stop_throwaway_service
