#!/usr/bin/env bash
# Smoke test of a running stagedoor-checkout, from outside, with curl:
#
#   scripts/smoke.sh [BASE_URL]        (default http://127.0.0.1:8080)
#
# health, readiness, the seat map of the event `demo`, a hold on an available
# seat, an order for it with a fresh Idempotency-Key (pm_card_visa), the same
# order again (201 replayed, byte-identical body), and the same key with
# another body (422 idempotency-key-reused). Prints each step; stops at the
# first surprise with what was expected and what came, and exits 1.
#
# Environment:
#   SMOKE_TOKEN     a bearer token for the service (e.g. from
#                   `docker compose exec -T checkout stagedoor-checkout token --sub smoke`);
#                   when unset, one is minted with `stagedoor-checkout token`,
#                   which signs with the local config's secret, so it fits a
#                   service started with `cargo run --release` from this tree
#   STAGEDOOR_BIN   the stagedoor-checkout binary to mint it with
#                   (default: `cargo run --release -q --`)
#   SMOKE_EVENT     the event to buy from (default: demo)
#
# Each run sells one seat of the event. Needs curl, and jq or python3.
set -euo pipefail

base="${1:-http://127.0.0.1:8080}"
base="${base%/}"
event="${SMOKE_EVENT:-demo}"
problems="https://stagedoor.example/problems"

work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT

fail() {
    printf 'FAIL: %s\n' "$*" >&2
    exit 1
}

# fail_showing NAME MESSAGE: fail, showing the answer NAME's headers and
# (the start of) its body.
fail_showing() {
    printf 'FAIL: %s\n--- headers\n' "$2" >&2
    tr -d '\r' <"$work/$1.headers" >&2 || true
    printf -- '--- body\n' >&2
    head -c 2000 "$work/$1.body" >&2 || true
    printf '\n' >&2
    exit 1
}

# call NAME EXPECTED_STATUS METHOD PATH [curl args...]: one request, its
# headers and body kept in $work/NAME.{headers,body}; any other status fails.
call() {
    local name=$1 expected=$2 method=$3 path=$4 status
    shift 4
    if ! status="$(curl -sS --max-time 30 -X "$method" -o "$work/$name.body" \
        -D "$work/$name.headers" -w '%{http_code}' "$@" "$base$path")"; then
        fail "$method $path: expected $expected, but the request failed (is the service up at $base?)"
    fi
    [ "$status" = "$expected" ] ||
        fail_showing "$name" "$method $path: expected $expected, got $status"
    printf 'ok    %-6s %s -> %s\n' "$method" "$path" "$status"
}

# header NAME HEADER: the value of a response header (case-insensitive name).
header() {
    { tr -d '\r' <"$work/$1.headers" | grep -i "^$2:" || true; } |
        tail -n 1 | sed 's/^[^:]*:[[:space:]]*//'
}

# expect NAME WHAT EXPECTED ACTUAL: on a difference, fail showing the answer NAME.
expect() {
    [ "$3" = "$4" ] ||
        fail_showing "$1" "$2: expected ${3:-(nothing)}, got ${4:-(nothing)}"
}

# JSON, with jq when it is there, else python3.
# field FILE KEY: a top-level scalar member ("" when absent or null).
# available_seats FILE: the seat_id of every available seat, one per line.
if command -v jq >/dev/null; then
    field() { jq -r --arg k "$2" '.[$k] // "" | tostring' "$1"; }
    available_seats() { jq -r '.seats[] | select(.status == "available") | .seat_id' "$1"; }
elif command -v python3 >/dev/null; then
    field() {
        python3 -c 'import json, sys
v = json.load(open(sys.argv[1])).get(sys.argv[2])
print("" if v is None else v)' "$1" "$2"
    }
    available_seats() {
        python3 -c 'import json, sys
for s in json.load(open(sys.argv[1]))["seats"]:
    if s["status"] == "available":
        print(s["seat_id"])' "$1"
    }
else
    fail "needs jq or python3 to read JSON"
fi

new_key() {
    if [ -r /proc/sys/kernel/random/uuid ]; then
        cat /proc/sys/kernel/random/uuid
    else
        printf 'smoke-%s-%s%s%s\n' "$(date +%s)" "$RANDOM" "$RANDOM" "$RANDOM"
    fi
}

echo "smoke test of $base"

# 1. Liveness and readiness (no token needed).
call healthz 200 GET /healthz
call readyz 200 GET /readyz

# 2. A buyer of our own, so that no one else's holds or keys get in the way.
if [ -n "${SMOKE_TOKEN:-}" ]; then
    token="$SMOKE_TOKEN"
    echo "ok    token from SMOKE_TOKEN"
else
    buyer="smoke-$(date +%s)-$RANDOM"
    case "${STAGEDOOR_BIN:-}" in
        "") mint=(cargo run --release -q --) ;;
        /*) mint=("$STAGEDOOR_BIN") ;;
        *) mint=("$PWD/$STAGEDOOR_BIN") ;;
    esac
    # From the repository's root, where ./config (and Cargo.toml) are.
    token="$(cd "$(dirname "$0")/.." && "${mint[@]}" token --sub "$buyer")" ||
        fail "minting a token with: ${mint[*]} token --sub $buyer"
    [ -n "$token" ] || fail "minting a token with: ${mint[*]} token --sub $buyer: printed nothing"
    echo "ok    token for buyer $buyer (${mint[*]} token)"
fi
auth="Authorization: Bearer $token"
json="Content-Type: application/json"

# 3. The seat map; pick one available seat at random (fewer collisions with
#    anyone else buying at the same time).
call seats 200 GET "/events/$event/seats" -H "$auth"
mapfile -t seats < <(available_seats "$work/seats.body")
[ "${#seats[@]}" -gt 0 ] ||
    fail "event $event: expected an available seat, got none (seed another event with \`stagedoor-checkout seed --event smoke --seats 200\` and set SMOKE_EVENT=smoke)"
seat="${seats[RANDOM % ${#seats[@]}]}"
echo "      ${#seats[@]} seats available; taking seat $seat"

# 4. Hold it.
call hold 201 POST /holds -H "$auth" -H "$json" --data "{\"seat_id\": $seat}"
hold="$(field "$work/hold.body" hold_id)"
[ -n "$hold" ] || fail_showing hold "POST /holds: expected a hold_id in the body, got none"
echo "      hold $hold"

# 5. The click: a fresh key, one order.
key="$(new_key)"
order_body="{\"hold_ids\": [$hold], \"payment_method\": \"pm_card_visa\"}"
call order 201 POST /orders -H "$auth" -H "$json" -H "Idempotency-Key: $key" --data "$order_body"
order="$(field "$work/order.body" order_id)"
expect order "order status" paid "$(field "$work/order.body" status)"
expect order "Location header" "/orders/$order" "$(header order location)"
expect order "first answer's Idempotent-Replayed header" "" "$(header order idempotent-replayed)"
echo "      order $order paid (key $key)"

# 6. The same click again: the stored answer, replayed byte for byte.
call replay 201 POST /orders -H "$auth" -H "$json" -H "Idempotency-Key: $key" --data "$order_body"
expect replay "replay's Idempotent-Replayed header" true "$(header replay idempotent-replayed)"
expect replay "replay's Location header" "/orders/$order" "$(header replay location)"
if ! cmp -s "$work/order.body" "$work/replay.body"; then
    printf 'FAIL: replay body: expected the first answer byte for byte\n--- first\n%s\n--- replay\n%s\n' \
        "$(cat "$work/order.body")" "$(cat "$work/replay.body")" >&2
    exit 1
fi
echo "      replayed: Idempotent-Replayed: true, body byte-identical"

# 7. The same key with another body: refused, never the stored answer.
call reused 422 POST /orders -H "$auth" -H "$json" -H "Idempotency-Key: $key" \
    --data "{\"hold_ids\": [$hold], \"payment_method\": \"pm_card_declined\"}"
expect reused "problem type" "$problems/idempotency-key-reused" "$(field "$work/reused.body" type)"
echo "      refused: idempotency-key-reused"

# 8. The order, read back.
call get_order 200 GET "/orders/$order" -H "$auth"
expect get_order "order status read back" paid "$(field "$work/get_order.body" status)"

echo "smoke test passed: $base"
