#!/usr/bin/env bash
# The browser test of the demo checkout page, end to end:
#
#   scripts/ci/browser-test.sh [--release]
#
# Starts a real `payrail-sandbox` and a real `stagedoor-checkout` (built with
# cargo; debug, or release with --release) on free ports against a throwaway
# database, mints a token, and runs tests/browser/checkout.mjs, which drives
# /demo/ and the client module it imports (/client/checkout.js) in headless
# Chromium (playwright-core, Debian's chromium). Whatever
# happens, both processes are stopped and the database is dropped.
#
# Installs what it needs when missing: Debian's `chromium` (apt-get) and the
# npm packages of tests/browser (`npm ci`). The last line is
# `browser: N passed, M failed`; the exit status is non-zero on any failure.
#
# Environment: CARGO_TARGET_DIR (default /var/tmp/stagedoor-target, as CI),
# PGHOST_URL (default postgres://postgres@127.0.0.1:5432), SCREENSHOTS
# (default $CARGO_TARGET_DIR/browser: the page at 1280 and 390 px wide, and
# a decline; CI keeps the folder).
set -euo pipefail
cd "$(dirname "$0")/../.."

profile=debug
build_args=(--locked --workspace --bins)
case "${1:-}" in
    --release) profile=release; build_args+=(--release) ;;
    "") ;;
    *) echo "usage: $0 [--release]" >&2; exit 2 ;;
esac

export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-/var/tmp/stagedoor-target}"
pg="${PGHOST_URL:-postgres://postgres@127.0.0.1:5432}"
db="stagedoor_browser_$$"
# Longer than the fault latency the test sets (the page's 3 s timeout + 1.5 s),
# so the service gets Payrail's answer while the page has given up on it.
payrail_timeout_ms=8000
# Short enough that a hold's countdown reaches its last-minute warning while
# the test waits; long enough for every step that pays for a hold.
hold_ttl_secs=75

step() { printf '==> %s\n' "$*"; }
as_root() { if [ "$(id -u)" -eq 0 ]; then "$@"; else sudo "$@"; fi; }

# ---------------------------------------------------------------- tools

if ! command -v chromium >/dev/null; then
    step "installing Debian's chromium"
    export DEBIAN_FRONTEND=noninteractive
    if ! apt-cache policy chromium 2>/dev/null | grep -q 'Candidate: [0-9]'; then
        as_root apt-get -o DPkg::Lock::Timeout=600 update -q
    fi
    as_root apt-get -o DPkg::Lock::Timeout=600 install -y -q --no-install-recommends chromium
fi
if [ ! -d tests/browser/node_modules ]; then
    step "npm ci (tests/browser)"
    (cd tests/browser && npm ci --no-audit --no-fund)
fi

step "cargo build ($profile)"
cargo build "${build_args[@]}"
bin="$CARGO_TARGET_DIR/$profile"

scripts/services.sh >/dev/null

# ---------------------------------------------------------------- processes

work="$(mktemp -d)"
sandbox_pid=""
service_pid=""

stop() { # stop PID: SIGTERM, then SIGKILL after 10 s.
    local pid=$1
    [ -n "$pid" ] && kill -0 "$pid" 2>/dev/null || return 0
    kill -TERM "$pid" 2>/dev/null || true
    for _ in $(seq 1 100); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
    kill -KILL "$pid" 2>/dev/null || true
    wait "$pid" 2>/dev/null || true
}

cleanup() {
    local status=$?
    stop "$service_pid"
    stop "$sandbox_pid"
    if [ "$status" -ne 0 ]; then
        for log in service sandbox; do
            if [ -s "$work/$log.log" ]; then
                echo "--- the $log's log (last 40 lines)"
                tail -n 40 "$work/$log.log"
            fi
        done
    fi
    psql "$pg/postgres" -qc "DROP DATABASE IF EXISTS \"$db\" WITH (FORCE)" >/dev/null 2>&1 || true
    rm -rf "$work"
    exit "$status"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

# Databases of earlier runs that were killed (their shell is gone).
psql "$pg/postgres" -Atc "SELECT datname FROM pg_database WHERE datname LIKE 'stagedoor_browser_%'" \
    | while read -r old; do
        kill -0 "${old#stagedoor_browser_}" 2>/dev/null \
            || psql "$pg/postgres" -qc "DROP DATABASE IF EXISTS \"$old\" WITH (FORCE)"
    done

step "starting payrail-sandbox"
"$bin/payrail-sandbox" --port 0 >"$work/sandbox.out" 2>"$work/sandbox.log" &
sandbox_pid=$!
sandbox_url=""
for _ in $(seq 1 100); do
    sandbox_url="$(sed -n 's/^payrail-sandbox listening on //p' "$work/sandbox.out")"
    [ -n "$sandbox_url" ] && break
    kill -0 "$sandbox_pid" 2>/dev/null || { echo "payrail-sandbox exited" >&2; exit 1; }
    sleep 0.1
done
[ -n "$sandbox_url" ] || { echo "payrail-sandbox printed no address in 10 s" >&2; exit 1; }
echo "    $sandbox_url"

port="$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')"
service_url="http://127.0.0.1:$port"
# The same service under another host name is another origin: the CORS steps
# call the API from it.
cors_origin="http://localhost:$port"
service_env=(
    STAGEDOOR_ENV=local
    DATABASE_URL="$pg/$db"
    STAGEDOOR__SERVER__PORT="$port"
    STAGEDOOR__PAYRAIL__SANDBOX=false
    STAGEDOOR__PAYRAIL__BASE_URL="$sandbox_url"
    STAGEDOOR__PAYRAIL__TIMEOUT_MS="$payrail_timeout_ms"
    STAGEDOOR__DEMO__SEED=true
    STAGEDOOR__HOLDS__TTL_SECS="$hold_ttl_secs"
    STAGEDOOR__HTTP__CORS_ORIGINS="$cors_origin"
    RUST_LOG="${RUST_LOG:-info}"
)

step "starting stagedoor-checkout on $service_url (database $db)"
env "${service_env[@]}" "$bin/stagedoor-checkout" serve >"$work/service.log" 2>&1 &
service_pid=$!
ready_by=$((SECONDS + 60))
until curl -fsS -o /dev/null --max-time 2 "$service_url/readyz" 2>/dev/null; do
    kill -0 "$service_pid" 2>/dev/null || { echo "stagedoor-checkout exited before it was ready" >&2; exit 1; }
    [ "$SECONDS" -lt "$ready_by" ] || { echo "stagedoor-checkout not ready after 60 s" >&2; exit 1; }
    sleep 0.2
done

token="$(env "${service_env[@]}" "$bin/stagedoor-checkout" token --sub browser-buyer)"
other_token="$(env "${service_env[@]}" "$bin/stagedoor-checkout" token --sub browser-other)"

step "tests/browser/checkout.mjs (headless $(chromium --version 2>/dev/null | head -n1))"
STAGEDOOR_URL="$service_url" \
PAYRAIL_URL="$sandbox_url" \
STAGEDOOR_TOKEN="$token" \
OTHER_TOKEN="$other_token" \
HOLD_TTL_SECS="$hold_ttl_secs" \
PAYRAIL_TIMEOUT_MS="$payrail_timeout_ms" \
CORS_ORIGIN="$cors_origin" \
CHROMIUM="$(command -v chromium)" \
SCREENSHOTS="${SCREENSHOTS:-$CARGO_TARGET_DIR/browser}" \
    node tests/browser/checkout.mjs
