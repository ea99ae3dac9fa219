#!/usr/bin/env bash
# The seat map's views per second, measured with wrk on this machine:
#
#   scripts/seat-map-views.sh BINARY [history | year | retention]
#
# Starts BINARY (a release build of `stagedoor-checkout`, of this tree or of
# another commit, so that two trees can be alternated) on a free port of
# 127.0.0.1 and a database of its own, created and dropped here, with one
# event of 2,000 seats (`big`). With `history`, 400,000 holds of a past
# event, expired 30 days ago, are in the table too (`holds.retention_secs`
# is set to a year for the run, so that the retention keeps them); with
# `year`, 1,000,000 of them (fifty a seat), as many as a busy box office's
# year of holds (tests/api/plans.rs says how that is sized). With
# `retention`, the same holds, and the retention at its default (a day
# past expiry) runs 2 s after the start, during the first measurement: its
# log line (holds deleted, elapsed_ms) is printed at the end. Then
# `wrk -t2 -c64` for 10 s on the map of a buyer with no hold, gzipped, and
# again with the map's `If-None-Match` (304s), each printing its requests
# per second, latency, and the database's transactions per view
# (`pg_stat_database`: each statement outside a transaction is one).
#
# Needs PostgreSQL on 127.0.0.1 (scripts/services.sh), psql, curl and wrk.
set -euo pipefail
cd "$(dirname "$0")/.."

bin="$1"
history="${2:-}"
pg="${SEAT_MAP_VIEWS_PG:-postgres://postgres@127.0.0.1:5432}"
db="stagedoor_seat_map_views_$$"
port="$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')"

export STAGEDOOR_ENV=local STAGEDOOR_CONFIG_DIR="$PWD/config" RUST_LOG=warn
export DATABASE_URL="$pg/$db" STAGEDOOR__SERVER__PORT="$port"
if [ "$history" = retention ]; then
    export STAGEDOOR__IDEMPOTENCY__CLEANUP_INTERVAL_SECS=2
    export RUST_LOG=warn,stagedoor_checkout::jobs=info
else
    export STAGEDOOR__HOLDS__RETENTION_SECS=31536000
fi

psql -q "$pg/postgres" -c "CREATE DATABASE $db"
server=
cleanup() {
    [ -n "$server" ] && kill "$server" 2>/dev/null && wait "$server" 2>/dev/null
    psql -q "$pg/postgres" -c "DROP DATABASE IF EXISTS $db"
}
trap cleanup EXIT

"$bin" migrate >/dev/null
"$bin" seed --event big --seats 2000 >/dev/null
if [ -n "$history" ]; then
    "$bin" seed --event past --seats 20000 >/dev/null
    per_seat=20
    [ "$history" = year ] && per_seat=50
    # Holds of each past seat, one after another, each 5 minutes long.
    psql -q "$pg/$db" -c "INSERT INTO holds (seat_id, user_id, created_at, expires_at)
        SELECT seat_id, 'past' || n, now() - interval '30 days' + n * interval '10 minutes',
               now() - interval '30 days' + n * interval '10 minutes' + interval '5 minutes'
        FROM seats, generate_series(1, $per_seat) AS n WHERE event_id = 'past'" \
        -c "VACUUM ANALYZE holds"
fi
echo "holds in the table: $(psql -tA "$pg/$db" -c 'SELECT count(*) FROM holds')"

"$bin" serve >"/var/tmp/seat-map-views-$port.log" 2>&1 &
server=$!
for _ in $(seq 1 60); do
    curl -s -o /dev/null "http://127.0.0.1:$port/healthz" && break
    sleep 0.5
done
token="$("$bin" token --sub crowd)"
url="http://127.0.0.1:$port/events/big/seats"
tag="$(curl -s -D - -o /dev/null -H "Authorization: Bearer $token" "$url" |
    awk 'tolower($1) == "etag:" { print $2 }' | tr -d '\r')"

# Transactions of the database so far; the statistics reach the view
# within a second of each backend's last statement.
transactions() {
    sleep 1.5
    psql -tA "$pg/postgres" -c "SELECT xact_commit + xact_rollback FROM pg_stat_database WHERE datname = '$db'"
}

run() {
    local what="$1"
    shift
    local before after views
    before="$(transactions)"
    out="$(wrk -t2 -c64 -d10s -H "Authorization: Bearer $token" -H 'Accept-Encoding: gzip' "$@" "$url")"
    after="$(transactions)"
    views="$(echo "$out" | awk '/requests in/ { print $1 }')"
    echo "$what: $(echo "$out" | awk '/Requests\/sec/ { print $2 }') views/s," \
        "latency $(echo "$out" | awk '/Latency/ { print "mean " $2 ", max " $4 }')," \
        "$(python3 -c "print(f'{($after - $before) / max($views, 1):.3f}')") transactions a view" \
        "$(echo "$out" | grep -E 'Socket|Non-2xx' | tr '\n' ' ')"
}

[ "$history" = retention ] || wrk -t2 -c64 -d3s -H "Authorization: Bearer $token" "$url" >/dev/null
run "200, gzip"
run "304" -H "If-None-Match: $tag"
if [ "$history" = retention ]; then
    grep -i "retention.*holds=[1-9]" "/var/tmp/seat-map-views-$port.log" || true
    echo "holds left: $(psql -tA "$pg/$db" -c 'SELECT count(*) FROM holds')"
fi
