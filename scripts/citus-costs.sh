#!/usr/bin/env bash
# What each statement of a first click costs each node of the cluster of
# scripts/citus.sh: the PostgreSQL CPU time of the coordinator's server and
# of the workers' (every process of each, from the kernel's counters), per
# call, over N calls of pgbench on one connection (prepared statements and
# custom plans, as the service runs them on Citus), less the cost of the
# line every script starts with. Figures for docs/PERFORMANCE.md ("What a
# first click costs the coordinator, statement by statement"), and of a
# sketch that keeps the holds on the buyer's shard beside its orders and
# keys: its first click, and what its hold and its seat map would cost.
#
#   scripts/citus-costs.sh [N [R]]   N calls per statement (2000), in each
#                                    of R rounds (3); the median round is shown
#
# Works in a database of its own (stagedoor_costs), migrated and laid out
# like the service's, dropped at the end. Needs pgbench (Debian's
# postgresql-15, beside the server that runs Citus) and the cluster's
# servers on this machine.
set -euo pipefail
cd "$(dirname "$0")/.."

calls="${1:-2000}"
rounds="${2:-3}"
dir="${STAGEDOOR_CITUS_DIR:-/var/tmp/stagedoor-citus}"
port="${STAGEDOOR_CITUS_PORT:-9700}"
export STAGEDOOR_CITUS_DB=stagedoor_costs
scripts_dir="$(mktemp -d)"
trap 'rm -rf "$scripts_dir"; scripts/citus.sh drop >/dev/null 2>&1 || true' EXIT
scripts/citus.sh >/dev/null 2>"$scripts_dir/citus.log" || { cat "$scripts_dir/citus.log" >&2; exit 1; }

sql() { psql -X -q -v ON_ERROR_STOP=1 -h 127.0.0.1 -p "$port" -U postgres -d "$STAGEDOOR_CITUS_DB" "$@"; }

# CPU milliseconds so far of one node's server: the postmaster, the
# children it has waited for, and the children alive now.
node_cpu() { # data directory
    local postmaster ticks=0 stat child
    postmaster="$(head -n 1 "$1/postmaster.pid")"
    read -r -a stat <"/proc/$postmaster/stat"
    ticks=$((stat[13] + stat[14] + stat[15] + stat[16]))
    for child in $(pgrep -P "$postmaster"); do
        read -r -a stat 2>/dev/null <"/proc/$child/stat" || continue
        ticks=$((ticks + stat[13] + stat[14]))
    done
    echo $((ticks * 1000 / $(getconf CLK_TCK)))
}
workers_cpu() {
    local sum=0 worker
    for worker in "$dir"/worker*/; do sum=$((sum + $(node_cpu "$worker"))); done
    echo "$sum"
}

# Seats and holds of the buyer `alice`, numbered from the sequence's next
# value on (the sketch's holds get the same numbers): each call of a script
# that orders takes the next hold.
fresh_holds() { # count
    sql -Atc "INSERT INTO seats (event_id, label, price_cents)
              SELECT 'costs', 'S' || g || '-' || clock_timestamp(), 4500 FROM generate_series(1, $1) g" >/dev/null
    local first
    first="$(sql -Atc "WITH free AS (
                           SELECT seat_id FROM seats s WHERE event_id = 'costs'
                             AND NOT EXISTS (SELECT 1 FROM holds h WHERE h.seat_id = s.seat_id)
                           ORDER BY seat_id
                       ), made AS (
                           INSERT INTO holds (seat_id, user_id, expires_at)
                           SELECT seat_id, 'alice', now() + interval '1 day' FROM free
                           RETURNING hold_id
                       )
                       SELECT min(hold_id) FROM made")"
    sql -Atc "SELECT setval('costs_seq', $first, false)" >/dev/null
    sql -Atc "INSERT INTO costs_holds (user_id, hold_id, expires_at)
              SELECT 'alice', g, now() + interval '1 day' FROM generate_series($first, $first + $1 - 1) g" >/dev/null
    analyze seats holds costs_holds
}
# Seats no one holds, numbered from `costs_seat_seq`'s next value on: each
# call of a script that holds takes the next one.
fresh_seats() { # count
    sql -Atc "WITH made AS (
                  INSERT INTO seats (event_id, label, price_cents)
                  SELECT 'costs', 'F' || g || '-' || clock_timestamp(), 4500 FROM generate_series(1, $1) g
                  RETURNING seat_id
              )
              SELECT setval('costs_seat_seq', min(seat_id), false) FROM made" >/dev/null
    analyze seats
}
# Fresh statistics for the tables just filled, then a rest: until the
# postmaster has reaped these sessions' backends, whose times would count
# in the next window.
analyze() { # table...
    local tables="$*"
    sql -c "VACUUM ANALYZE ${tables// /, }" >/dev/null
    sleep 1
}

sql >/dev/null <<'SQL'
INSERT INTO events (event_id) VALUES ('costs');
CREATE SEQUENCE costs_seq;
-- The same holds as a plain table of the coordinator's, which Citus does
-- not manage: what the managed table's local execution adds.
CREATE TABLE holds_plain (LIKE holds INCLUDING ALL);
-- No autovacuum worker's CPU in a node's figures.
ALTER TABLE seats SET (autovacuum_enabled = false);
ALTER TABLE holds SET (autovacuum_enabled = false);
ALTER TABLE holds_plain SET (autovacuum_enabled = false);
ALTER TABLE orders SET (autovacuum_enabled = false);
ALTER TABLE idempotency_keys SET (autovacuum_enabled = false);
SELECT * FROM idempotency_claim('alice', 'answered', '\x01', 1, 60, 86400);

-- A sketch, not the service's layout: holds on the buyer's shard, beside
-- the buyer's orders and keys, so that the order step and the settlement
-- are each one call delegated whole to the buyer's worker. A seat's
-- exclusivity is then kept by its seat row (below), which the sketch's
-- hold writes and its first click does not.
CREATE TABLE costs_holds (
    user_id text NOT NULL, hold_id bigint NOT NULL, order_id uuid,
    expires_at timestamptz NOT NULL, sold boolean NOT NULL DEFAULT false,
    PRIMARY KEY (user_id, hold_id));
SELECT create_distributed_table('costs_holds', 'user_id', colocate_with => 'idempotency_keys');
ALTER TABLE costs_holds SET (autovacuum_enabled = false);
CREATE FUNCTION costs_place(p_user text, p_key text, p_hold bigint, p_order uuid) RETURNS void
LANGUAGE plpgsql AS $$
BEGIN
    UPDATE costs_holds SET order_id = p_order
    WHERE user_id = p_user AND hold_id = p_hold AND order_id IS NULL AND expires_at > now();
    INSERT INTO orders (order_id, user_id, status, amount_cents, currency, payment_method,
                        hold_ids, seats, idempotency_key)
    VALUES (p_order, p_user, 'payment_pending', 4500, 'USD', 'pm_card_visa',
            ARRAY[p_hold], ARRAY['S1'], p_key);
    UPDATE idempotency_keys SET effect = p_order::text WHERE user_id = p_user AND key = p_key;
END $$;
CREATE FUNCTION costs_settle(p_user text, p_key text, p_order uuid, p_charge text) RETURNS void
LANGUAGE plpgsql AS $$
BEGIN
    UPDATE orders SET status = 'paid', charge_id = p_charge, updated_at = now()
    WHERE user_id = p_user AND order_id = p_order;
    UPDATE costs_holds SET sold = true WHERE user_id = p_user AND order_id = p_order;
    UPDATE idempotency_keys
    SET response_status = 201, response_content_type = 'application/json',
        response_location = '/orders/' || p_order, response_body = '\x7b7d'
    WHERE user_id = p_user AND key = p_key;
END $$;
SELECT create_distributed_function('costs_place(text,text,bigint,uuid)', '$1',
                                   colocate_with => 'idempotency_keys');
SELECT create_distributed_function('costs_settle(text,text,uuid,text)', '$1',
                                   colocate_with => 'idempotency_keys');
-- The sketch's seat row, on the coordinator beside the seats: which hold
-- has the seat until when. A hold writes it together with the buyer's hold
-- (two nodes, so a two-phase commit). Once `until` has passed the seat is
-- free only if that hold is in no order, which its buyer's shard knows.
-- `taken_at` is the hold's now() as a value: Citus refuses a non-immutable
-- function in an ON CONFLICT's WHERE.
CREATE TABLE costs_seat_claims (
    seat_id bigint PRIMARY KEY, user_id text NOT NULL, hold_id bigint NOT NULL,
    taken_at timestamptz NOT NULL, until timestamptz NOT NULL);
SELECT citus_add_local_table_to_metadata('costs_seat_claims');
ALTER TABLE costs_seat_claims SET (autovacuum_enabled = false);
CREATE SEQUENCE costs_seat_seq;

-- A seat map of 200 seats, each held by a buyer of its own, every other
-- one in a paid order: in the service's layout, and in the sketch's, where
-- the ordered seats' claims have run out and only their buyers' shards
-- know that the seats are sold.
INSERT INTO events (event_id) VALUES ('costs_map');
INSERT INTO seats (event_id, label, price_cents)
SELECT 'costs_map', 'M' || g, 4500 FROM generate_series(1, 200) g;
INSERT INTO holds (seat_id, user_id, expires_at, order_id, sold)
SELECT seat_id, 'm' || seat_id, now() + interval '1 day',
       CASE WHEN seat_id % 2 = 0 THEN gen_random_uuid() END, seat_id % 2 = 0
FROM seats WHERE event_id = 'costs_map';
INSERT INTO costs_holds (user_id, hold_id, expires_at, order_id, sold)
SELECT user_id, seat_id, created_at + interval '1 second', order_id, sold FROM holds
WHERE seat_id IN (SELECT seat_id FROM seats WHERE event_id = 'costs_map');
INSERT INTO costs_seat_claims (seat_id, user_id, hold_id, taken_at, until)
SELECT hold_id, user_id, hold_id, now(), expires_at FROM costs_holds;
UPDATE costs_seat_claims SET until = now() + interval '1 day' WHERE seat_id % 2 = 1;
SQL
fresh_holds 2000
sql -c "INSERT INTO holds_plain OVERRIDING SYSTEM VALUE SELECT * FROM holds" -c "ANALYZE" >/dev/null

# Every script's first line, and the baseline the others are net of.
next='SELECT nextval('"'costs_seq'"') AS i, nextval('"'costs_seat_seq'"') AS s, gen_random_uuid() AS oid \gset'
script() { # name statement...
    local name="$1"
    shift
    printf '%s\n' "$next" "$@" >"$scripts_dir/$name.sql"
}
script baseline
script read_key "SELECT response_status FROM idempotency_keys WHERE user_id = 'alice' AND key = 'answered';"
script claim_lost "SELECT * FROM idempotency_claim('alice', 'answered', '\x01', 1, 60, 86400);"
script claim_won "SELECT * FROM idempotency_claim('alice', 'new' || :i, '\x01', :i, 60, 86400);"
script read_hold_plain "SELECT expires_at FROM holds_plain WHERE hold_id = :i % 2000 + 1;"
script read_hold "SELECT expires_at FROM holds WHERE hold_id = :i % 2000 + 1;"
script write_hold_plain "UPDATE holds_plain SET expires_at = expires_at WHERE hold_id = :i % 2000 + 1;"
script write_hold "UPDATE holds SET expires_at = expires_at WHERE hold_id = :i % 2000 + 1;"
script one_worker "BEGIN;" \
    "UPDATE idempotency_keys SET request_hash = request_hash WHERE user_id = 'alice' AND key = 'answered';" \
    "UPDATE idempotency_keys SET request_hash = request_hash WHERE user_id = 'alice' AND key = 'answered';" \
    "COMMIT;"
script two_phase "BEGIN;" \
    "UPDATE holds SET expires_at = expires_at WHERE hold_id = :i % 2000 + 1;" \
    "UPDATE idempotency_keys SET request_hash = request_hash WHERE user_id = 'alice' AND key = 'answered';" \
    "COMMIT;"
claim="SELECT * FROM idempotency_claim('alice', 'click' || :i, '\x01', :i, 60, 86400);"
place="SELECT * FROM checkout_place_order('alice', 'click' || :i, :i, :oid, :oid::uuid, ARRAY[:i]::bigint[], 'USD', 'pm_card_visa');"
settle="SELECT * FROM checkout_settle_claimed('alice', 'click' || :i, :i, 201::smallint, 'application/json', '/orders/' || :oid, '\x7b7d', :oid::uuid, 'paid', 'ch_' || :i);"
script claim_place "$claim" "$place"
script click "$claim" "$place" "$settle"
script sketch_click "$claim" \
    "SELECT costs_place('alice', 'click' || :i, :i, :oid::uuid);" \
    "SELECT costs_settle('alice', 'click' || :i, :oid::uuid, 'ch_' || :i);"
# The other clicks the sketch changes: a hold without a key
# (src/checkout/holds.rs), and the seat map (src/checkout/seats.rs).
script hold "WITH seat AS (SELECT seat_id FROM seats WHERE seat_id = :s FOR NO KEY UPDATE)
    INSERT INTO holds (seat_id, user_id, expires_at)
    SELECT seat_id, 'bob', now() + make_interval(secs => 600) FROM seat RETURNING hold_id, expires_at;"
script sketch_hold "BEGIN;" \
    "INSERT INTO costs_seat_claims (seat_id, user_id, hold_id, taken_at, until)
    VALUES (:s, 'bob', :s, now(), now() + make_interval(secs => 600))
    ON CONFLICT (seat_id) DO UPDATE SET user_id = excluded.user_id, hold_id = excluded.hold_id,
                                        taken_at = excluded.taken_at, until = excluded.until
    WHERE costs_seat_claims.until <= excluded.taken_at;" \
    "INSERT INTO costs_holds (user_id, hold_id, expires_at)
    VALUES ('bob', :s, now() + make_interval(secs => 600)) RETURNING hold_id, expires_at;" \
    "COMMIT;"
script map "SELECT s.seat_id, s.label, s.price_cents,
           CASE WHEN h.sold THEN 'sold' WHEN h.hold_id IS NOT NULL THEN 'held' ELSE 'available' END AS status,
           CASE WHEN h.user_id = 'alice' AND h.order_id IS NULL THEN h.hold_id END AS your_hold_id,
           h.expires_at
    FROM seats s
    LEFT JOIN holds h ON h.seat_id = s.seat_id AND (h.order_id IS NOT NULL OR h.expires_at > now())
    WHERE s.event_id = 'costs_map' ORDER BY s.seat_id;"
script sketch_map "WITH c AS MATERIALIZED (
        SELECT s.seat_id, s.label, s.price_cents, c.user_id, c.hold_id, c.until
        FROM seats s LEFT JOIN costs_seat_claims c ON c.seat_id = s.seat_id
        WHERE s.event_id = 'costs_map'
    ), h AS (
        SELECT user_id, hold_id, order_id, sold FROM costs_holds
        WHERE (user_id, hold_id) IN (SELECT user_id, hold_id FROM c WHERE until <= now())
    )
    SELECT c.seat_id, c.label, c.price_cents,
           CASE WHEN h.sold THEN 'sold' WHEN c.until > now() OR h.order_id IS NOT NULL THEN 'held'
                ELSE 'available' END AS status,
           CASE WHEN c.user_id = 'alice' AND c.until > now() THEN c.hold_id END AS your_hold_id,
           c.until AS expires_at
    FROM c LEFT JOIN h ON h.user_id = c.user_id AND h.hold_id = c.hold_id
    ORDER BY c.seat_id;"

# Per script, each round's total CPU milliseconds, space-separated.
declare -A coordinator workers
measure() { # name
    case "$1" in
    claim_place | click | sketch_click) fresh_holds "$calls" ;;
    hold | sketch_hold) fresh_seats "$calls" ;;
    esac
    local c0 w0 c1 w1
    c0="$(node_cpu "$dir/coordinator")"
    w0="$(workers_cpu)"
    PGOPTIONS="-c plan_cache_mode=force_custom_plan" pgbench -n -h 127.0.0.1 -p "$port" -U postgres \
        -M prepared -c 1 -t "$calls" -f "$scripts_dir/$1.sql" "$STAGEDOOR_CITUS_DB" >/dev/null
    # A backend's times reach its postmaster's when it exits.
    sleep 0.5
    c1="$(node_cpu "$dir/coordinator")"
    w1="$(workers_cpu)"
    coordinator[$1]+="$((c1 - c0)) "
    workers[$1]+="$((w1 - w0)) "
}
# The median over the rounds of (total - minus) / calls.
per_call() { # totals minus-totals
    awk -v t="$1" -v m="$2" -v n="$calls" 'BEGIN {
        k = split(t, a, " "); split(m, b, " ")
        for (i = 1; i <= k; i++) d[i] = (a[i] - b[i]) / n
        for (i = 1; i <= k; i++) for (j = i + 1; j <= k; j++) if (d[j] < d[i]) { x = d[i]; d[i] = d[j]; d[j] = x }
        printf "%8.3f ms", d[int((k + 1) / 2)]
    }'
}
row() { # what name [net-of]
    local net="${3:-baseline}"
    printf '%-68s %s %s\n' "$1" "$(per_call "${coordinator[$2]}" "${coordinator[$net]}")" \
        "$(per_call "${workers[$2]}" "${workers[$net]}")"
}

for _ in $(seq "$rounds"); do
    for name in baseline read_key claim_lost claim_won read_hold_plain read_hold write_hold_plain \
        write_hold one_worker two_phase claim_place click sketch_click hold sketch_hold map sketch_map; do
        measure "$name"
    done
done
orders="$(sql -Atc "SELECT count(*) FILTER (WHERE status = 'paid') || ' of ' || count(*) || ' orders paid' FROM orders")"
printf '%-68s %11s %11s\n' "per call, median of $rounds rounds of $calls calls ($orders)" "coordinator" "workers"
row "a routed read of one key (one worker)" read_key
row "the claim, lost: a replay with the answer cache off (delegated)" claim_lost
row "the claim, won: a first click's (delegated)" claim_won
row "a hold read by id: a plain table on the coordinator" read_hold_plain
row "a hold read by id: the Citus-managed local table" read_hold
row "a hold written by id: a plain table on the coordinator" write_hold_plain
row "a hold written by id: the Citus-managed local table" write_hold
row "two routed writes of one key in a transaction (one worker commits)" one_worker
row "a hold and a key written in a transaction (two-phase commit)" two_phase
row "the order step (checkout_place_order), the claim's cost taken off" claim_place claim_won
row "the settlement (checkout_settle_claimed)" click claim_place
row "a first click's three calls (claim, order step, settlement)" click
row "the same three calls, holds on the buyer's shard (the sketch)" sketch_click
row "a hold (POST /holds without a key) as the service makes it" hold
row "the same in the sketch: the seat row and the buyer's hold (2PC)" sketch_hold
row "the seat map of 200 seats as the service reads it" map
row "the same in the sketch, the expired claims' holds on their shards" sketch_map
