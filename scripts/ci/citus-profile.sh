#!/usr/bin/env bash
# The Citus profile, as .ci/run runs it: on the three-node cluster of
# scripts/citus.sh, the API suite (STAGEDOOR_TEST_CITUS=1), a short chaos
# run (two instances, kills, Payrail faults), the README's checkout with
# curl (scripts/smoke.sh) against a service on the cluster, and the bench's
# Citus mode. The extension is built from ../shared/vendor when it is
# missing (scripts/citus.sh install); only on a machine without that
# vendored source does it print one line saying it skipped, and succeed.
#
# Environment: CARGO_TARGET_DIR (as CI), CITUS_CHAOS_SECS (30), and those of
# scripts/citus.sh.
set -euo pipefail
cd "$(dirname "$0")/../.."
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-/var/tmp/stagedoor-target}"

install_status=0
scripts/citus.sh install || install_status=$?
if [[ "$install_status" == 4 ]]; then
    echo "Citus profile skipped: the Citus extension is not installed, and the vendored source to build it from (STAGEDOOR_CITUS_VENDOR, else ../shared/vendor) is missing"
    exit 0
fi
[[ "$install_status" == 0 ]] || { echo "Citus profile: installing the extension failed" >&2; exit 1; }

say() { printf -- '-- citus profile: %s\n' "$*"; }
port="${STAGEDOOR_CITUS_PORT:-9700}"
started_here=""
pg_isready -q -h 127.0.0.1 -p "$port" || started_here=1
# A database of this run's own, dropped at the end: the walkthrough sells a
# seat of the demo event each time.
export STAGEDOOR_CITUS_DB="stagedoor_profile_$$"
service_pid=""
finish() {
    local status=$?
    if [[ -n "$service_pid" ]] && kill -0 "$service_pid" 2>/dev/null; then
        kill -TERM "$service_pid" 2>/dev/null || true
        wait "$service_pid" 2>/dev/null || true
    fi
    scripts/citus.sh drop >/dev/null 2>&1 || true
    [[ -z "$started_here" ]] || scripts/citus.sh stop >/dev/null 2>&1 || true
    exit "$status"
}
trap finish EXIT

# The release build CI's chaos step made (the same selection: nothing to do).
cargo build --release --locked --workspace --bins
bin="$CARGO_TARGET_DIR/release/stagedoor-checkout"
url="$(STAGEDOOR_BIN="$bin" scripts/citus.sh | sed -n 's/^DATABASE_URL=//p')"
[[ -n "$url" ]] || { echo "scripts/citus.sh printed no DATABASE_URL" >&2; exit 1; }
export DATABASE_URL="$url" STAGEDOOR_TEST_CITUS=1

say "the API suite on the cluster"
# Every test whose requests reach a distributed statement. Not crash::, which
# stalls a write with a trigger (Citus has no triggers on distributed
# tables); nor the HTTP layer's own tests (tokens, the identity provider,
# CORS, the client module, the OpenAPI document, health, traces, metrics,
# input refused before the key is read), which ask the cluster nothing the
# rest does not and ran on one PostgreSQL in the workspace step: on a new
# machine CI's 90 minutes are tight enough (docs/TESTING.md). Nor plans::,
# which fills a server of its own with a year of sales to read its plans.
cargo test --locked --test api -- --skip crash:: --skip auth:: --skip provider:: --skip cors:: \
    --skip client:: --skip openapi:: --skip health:: --skip trace:: --skip metrics:: \
    --skip bad_input:: --skip plans::

say "a short chaos run on the cluster"
CHAOS_SECS="${CITUS_CHAOS_SECS:-30}" CHAOS_INSTANCES=2 \
    cargo test --release --locked --test chaos -- --nocapture

say "the README's checkout with curl, against a service on the cluster"
log="$CARGO_TARGET_DIR/citus-service.log"
service_port=8090
STAGEDOOR__SERVER__PORT="$service_port" STAGEDOOR__DATABASE__GENERIC_PLANS=false \
    "$bin" serve >"$log" 2>&1 &
service_pid=$!
for _ in $(seq 1 60); do
    curl -fsS -o /dev/null --max-time 2 "http://127.0.0.1:$service_port/readyz" 2>/dev/null && break
    kill -0 "$service_pid" 2>/dev/null || { tail -n 40 "$log"; exit 1; }
    sleep 1
done
STAGEDOOR_BIN="$bin" scripts/smoke.sh "http://127.0.0.1:$service_port" \
    || { tail -n 40 "$log"; exit 1; }
kill -TERM "$service_pid"
wait "$service_pid"
service_pid=""

say "the bench's Citus mode"
cargo bench --locked --bench checkout -- --quick --citus
