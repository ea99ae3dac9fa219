#!/usr/bin/env bash
# Fuzzes the API from its own OpenAPI document (GET /openapi.json) with
# schemathesis: no answer may be a 5xx, and every answer must be as the
# document says (status, content type, headers, body schema).
#
#   scripts/ci/schemathesis.sh                  build the service, start it on a fresh
#                                            database, fuzz it, stop it, drop the database
#   scripts/ci/schemathesis.sh BASE_URL TOKEN   fuzz a running service as TOKEN's buyer
#
# SCHEMATHESIS_MAX_EXAMPLES (default 100) bounds the cases per operation;
# SCHEMATHESIS_SEED (default fixed, so CI runs repeat) or `random`.
# schemathesis is installed (once) into a venv outside the clone.
set -euo pipefail
cd "$(dirname "$0")/../.."

export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-/var/tmp/stagedoor-target}"
venv="${STAGEDOOR_SCHEMATHESIS_VENV:-/var/tmp/stagedoor-venv-schemathesis}"
version="4.32.5" # works with Python 3.11
max_examples="${SCHEMATHESIS_MAX_EXAMPLES:-100}"
seed="${SCHEMATHESIS_SEED:-20261130}"

install_schemathesis() {
    if [ "$("$venv/bin/schemathesis" --version 2>/dev/null)" != "schemathesis, version $version" ]; then
        echo "installing schemathesis $version into $venv" >&2
        [ -x "$venv/bin/python" ] || python3 -m venv "$venv"
        "$venv/bin/python" -m pip install --quiet --disable-pip-version-check "schemathesis==$version" >&2
    fi
}

# fuzz BASE_URL TOKEN
fuzz() {
    local base="${1%/}" token="$2"
    local seed_args=(--seed "$seed")
    [ "$seed" = "random" ] && seed_args=()
    # The Idempotency-Key header is generated from its documented pattern;
    # keys that collide get 422 idempotency-key-reused, which is documented.
    # schemathesis and Hypothesis keep caches in the working directory: run
    # them from the venv's, out of the clone.
    # --include-path-regex '^/' (every path): schemathesis leaves out the
    # operation that served the document (GET /openapi.json, now that the
    # document's relative server places it) unless a filter names it.
    (cd "$venv" && timeout --foreground --kill-after=10 600 bin/schemathesis run "$base/openapi.json" \
        --include-path-regex '^/' \
        --checks not_a_server_error,status_code_conformance,content_type_conformance,response_headers_conformance,response_schema_conformance \
        --header "Authorization: Bearer $token" \
        --max-examples "$max_examples" "${seed_args[@]}" \
        --request-timeout 20 \
        --generation-database none \
        --no-color)
}

install_schemathesis

if [ "$#" -eq 2 ]; then
    fuzz "$1" "$2"
    exit
elif [ "$#" -ne 0 ]; then
    echo "usage: $0 [BASE_URL TOKEN]" >&2
    exit 2
fi

# No arguments: a service of our own, on a database of our own, with the
# local configuration: embedded Payrail sandbox, the database created at
# start, the demo event seeded.
# shellcheck source=scripts/lib/throwaway-service.sh
. scripts/lib/throwaway-service.sh
cargo build --locked --bin stagedoor-checkout
bin="$CARGO_TARGET_DIR/debug/stagedoor-checkout"
throwaway_service stagedoor_st_ "$bin" STAGEDOOR__DEMO__SEED=true

token="$("$bin" token --sub st-buyer)"
fuzz "$base" "$token"
