#!/usr/bin/env bash
# A replay of an answered click here, against the same in actix-idempotent
# 0.1.1 (crates.io; the actix-web idempotency middleware, answers in Redis
# sessions), both measured with wrk on this machine in alternating rounds:
#
#   scripts/peer-replay.sh [ROUNDS] [SECS]      (default 3 rounds of 10 s)
#
# Builds the peer (benches/peer) and this service in release, in folders
# under /var/tmp (nothing built is kept in the tree), starts both on free
# ports of 127.0.0.1 — this service on a database of its own, created and
# dropped here, with `idempotency.answer_cache_mb` as set in the environment
# (STAGEDOOR__IDEMPOTENCY__ANSWER_CACHE_MB, default 64) — stores one answer
# in each, then runs `wrk -t2 -c64` on each replay in turn and prints the
# requests per second of every round, the medians and their ratio.
#
# Needs PostgreSQL and Redis on 127.0.0.1 (scripts/services.sh), curl, and
# wrk (Debian's package; installed when missing).
set -euo pipefail
cd "$(dirname "$0")/.."

rounds="${1:-3}"
secs="${2:-10}"
work=/var/tmp/stagedoor-peer-replay
peer_src="$work/peer"
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-/var/tmp/stagedoor-target}"
peer_target="$work/target"
pg="${PEER_REPLAY_PG:-postgres://postgres@127.0.0.1:5432}"
db="stagedoor_peer_replay_$$"

if ! command -v wrk >/dev/null; then
    apt-get -o DPkg::Lock::Timeout=600 install -y wrk >/dev/null ||
        { apt-get -o DPkg::Lock::Timeout=600 update >/dev/null &&
          apt-get -o DPkg::Lock::Timeout=600 install -y wrk >/dev/null; }
fi

free_port() {
    python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'
}

pids=()
cleanup() {
    for pid in "${pids[@]}"; do kill "$pid" 2>/dev/null || true; done
    psql "$pg/postgres" -qc "DROP DATABASE IF EXISTS $db WITH (FORCE)" >/dev/null 2>&1 || true
}
trap cleanup EXIT

wait_for() {
    for _ in $(seq 1 100); do
        curl -s -o /dev/null "$1" && return 0
        sleep 0.2
    done
    echo "nothing answers at $1" >&2
    exit 1
}

echo "== building the peer (actix-idempotent 0.1.1) and the service, release"
mkdir -p "$peer_src"
cp -r benches/peer/Cargo.toml benches/peer/src "$peer_src/"
CARGO_TARGET_DIR="$peer_target" cargo build --release -q --manifest-path "$peer_src/Cargo.toml"
cargo build --release -q --locked --bin stagedoor-checkout
service_bin="$CARGO_TARGET_DIR/release/stagedoor-checkout"

echo "== starting both"
peer_port="$(free_port)"
"$peer_target/release/stagedoor-peer" "$peer_port" redis://127.0.0.1:6379 &
pids+=($!)
service_port="$(free_port)"
export STAGEDOOR_ENV=local STAGEDOOR_CONFIG_DIR="$PWD/config" RUST_LOG=warn
export DATABASE_URL="$pg/$db" STAGEDOOR__SERVER__PORT="$service_port"
export STAGEDOOR__DATABASE__CREATE_IF_MISSING=true STAGEDOOR__DEMO__SEED=true
"$service_bin" serve &
pids+=($!)
wait_for "http://127.0.0.1:$peer_port/"
wait_for "http://127.0.0.1:$service_port/healthz"

echo "== one answer stored in each"
body='{"seat_id":1}'
jar="$work/peer.cookies"
rm -f "$jar"
curl -sS -c "$jar" -o /dev/null -X POST -H 'Content-Type: application/json' \
    -d "$body" "http://127.0.0.1:$peer_port/holds"
session="$(awk '$6 == "session" { print $7 }' "$jar")"
[ -n "$session" ] || { echo "the peer set no session cookie" >&2; exit 1; }
token="$("$service_bin" token --sub peer-replay --ttl-secs 3600)"
seat="$(curl -sS -H "Authorization: Bearer $token" "http://127.0.0.1:$service_port/events/demo/seats" |
    python3 -c 'import json, sys; print(next(s["seat_id"] for s in json.load(sys.stdin)["seats"] if s["status"] == "available"))')"
body="{\"seat_id\":$seat}"
key="peer-replay-$$"
status="$(curl -sS -o /dev/null -w '%{http_code}' -X POST -H "Authorization: Bearer $token" \
    -H "Idempotency-Key: $key" -H 'Content-Type: application/json' -d "$body" \
    "http://127.0.0.1:$service_port/holds")"
[ "$status" = 201 ] || { echo "the service answered $status to the first hold" >&2; exit 1; }

cat >"$work/peer.lua" <<EOF
wrk.method = "POST"
wrk.body = '{"seat_id":1}'
wrk.headers["Content-Type"] = "application/json"
wrk.headers["Cookie"] = "session=$session"
EOF
cat >"$work/service.lua" <<EOF
wrk.method = "POST"
wrk.body = '$body'
wrk.headers["Content-Type"] = "application/json"
wrk.headers["Authorization"] = "Bearer $token"
wrk.headers["Idempotency-Key"] = "$key"
EOF

# Both must replay, not answer afresh (or refuse): checked before measuring.
for target in "peer $peer_port" "service $service_port"; do
    set -- $target
    headers="$(curl -sS -D - -o /dev/null -X POST -b "session=$session" \
        -H "Authorization: Bearer $token" -H "Idempotency-Key: $key" \
        -H 'Content-Type: application/json' \
        -d "$([ "$1" = peer ] && echo '{"seat_id":1}' || echo "$body")" \
        "http://127.0.0.1:$2/holds")"
    grep -q '^HTTP/1.1 201' <<<"$headers" || { echo "$1 did not replay its 201:" >&2; echo "$headers" >&2; exit 1; }
done

rps() {
    wrk -t2 -c64 -d"${secs}s" -s "$work/$1.lua" "http://127.0.0.1:$2/holds" |
        awk '/^Requests\/sec:/ { print $2 } /Non-2xx/ { print "non-2xx: " $0 > "/dev/stderr" }'
}

median() { sort -g | awk '{ a[NR] = $1 } END { print (NR % 2) ? a[(NR + 1) / 2] : (a[NR / 2] + a[NR / 2 + 1]) / 2 }'; }

echo "== $rounds alternating rounds of ${secs} s each, wrk -t2 -c64"
: >"$work/peer.rps"
: >"$work/service.rps"
for round in $(seq 1 "$rounds"); do
    p="$(rps peer "$peer_port")"
    s="$(rps service "$service_port")"
    echo "$p" >>"$work/peer.rps"
    echo "$s" >>"$work/service.rps"
    printf 'round %d: actix-idempotent %s rps, stagedoor %s rps\n' "$round" "$p" "$s"
done
peer_median="$(median <"$work/peer.rps")"
service_median="$(median <"$work/service.rps")"
awk -v p="$peer_median" -v s="$service_median" -v mb="${STAGEDOOR__IDEMPOTENCY__ANSWER_CACHE_MB:-64}" \
    'BEGIN { printf "median: actix-idempotent %s rps, stagedoor %s rps, ratio %.2f (answer_cache_mb=%s)\n", p, s, s / p, mb }'
