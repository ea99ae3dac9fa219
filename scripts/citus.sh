#!/usr/bin/env bash
# A three-node Citus cluster on this machine: a coordinator and two workers,
# each its own `initdb` on a port of 127.0.0.1, from the Citus extension
# installed in the local PostgreSQL. It never builds or fetches Citus.
#
#   scripts/citus.sh         start the cluster (or reuse the running one),
#                            create the database, apply the migrations with
#                            `stagedoor-checkout migrate`, distribute the
#                            tables (scripts/citus-distribute.sql); prints
#                            DATABASE_URL=... as its only line on stdout
#   scripts/citus.sh stop    stop the three servers (their data stays)
#   scripts/citus.sh drop    drop the database from every node
#   scripts/citus.sh check   exit 0 when the extension is installed, else 3
#                            with the reason on the first line of stderr
#
# Environment: STAGEDOOR_CITUS_DIR (/var/tmp/stagedoor-citus), STAGEDOOR_CITUS_PORT
# (9700: the coordinator; the workers take the next two), STAGEDOOR_CITUS_DB
# (stagedoor), STAGEDOOR_BIN (the service binary; else `cargo run --release`).
#
# Every node also gets the extension and the node list in its `postgres`
# database: the test profile (STAGEDOOR_TEST_CITUS=1, DATABASE_URL pointing
# there) makes a cluster database per test from it.
set -euo pipefail
cd "$(dirname "$0")/.."

dir="${STAGEDOOR_CITUS_DIR:-/var/tmp/stagedoor-citus}"
base_port="${STAGEDOOR_CITUS_PORT:-9700}"
db="${STAGEDOOR_CITUS_DB:-stagedoor}"
ports=("$base_port" "$((base_port + 1))" "$((base_port + 2))")
names=(coordinator worker1 worker2)

say() { printf 'citus: %s\n' "$*" >&2; }

bindir="$(pg_config --bindir 2>/dev/null || true)"
check() {
    if [[ -z "$bindir" ]]; then
        say "pg_config is not on PATH: PostgreSQL's server development files are needed"
        return 3
    fi
    local libdir sharedir
    libdir="$(pg_config --pkglibdir)"
    sharedir="$(pg_config --sharedir)"
    if [[ ! -f "$libdir/citus.so" || ! -f "$sharedir/extension/citus.control" ]]; then
        say "the Citus extension is not installed in $(pg_config --version) (no $libdir/citus.so)"
        say "Install it (README, 'On a Citus cluster'): Citus 13.0.x from citusdata/citus, built with"
        say "  apt-get install postgresql-server-dev-15 libcurl4-openssl-dev liblz4-dev libzstd-dev libkrb5-dev"
        say "  ./configure && make -j2 && make install"
        return 3
    fi
}

# The server runs as `postgres` when root starts it: PostgreSQL refuses root.
as_server() {
    if [[ "$(id -u)" == 0 ]]; then runuser -u postgres -- "$@"; else "$@"; fi
}

psql_on() { # port database sql...
    local port="$1" database="$2"
    shift 2
    PGOPTIONS="-c client_min_messages=warning" psql -X -q -v ON_ERROR_STOP=1 -h 127.0.0.1 -p "$port" -U postgres -d "$database" "$@"
}

start_node() { # name port
    local data="$dir/$1" port="$2"
    if [[ ! -f "$data/PG_VERSION" ]]; then
        say "initdb $1 (port $port)"
        as_server "$bindir/initdb" -D "$data" -U postgres --auth=trust -E UTF8 --no-locale >/dev/null
        # Workers take the coordinator's connections for every shard a
        # statement touches, from each instance's pool: room for many.
        cat >>"$data/postgresql.conf" <<EOF
port = $port
listen_addresses = '127.0.0.1'
unix_socket_directories = '$dir'
shared_preload_libraries = 'citus'
max_connections = 300
max_prepared_transactions = 300
# Citus runs a maintenance worker per database: the tests make many.
max_worker_processes = 64
citus.max_client_connections = 300
EOF
    fi
    if as_server "$bindir/pg_ctl" -D "$data" status >/dev/null 2>&1; then
        return
    fi
    say "starting $1 on port $port"
    as_server "$bindir/pg_ctl" -D "$data" -l "$dir/$1.log" -w -t 60 start >/dev/null
}

# Makes `database` a database of the cluster: on every node, with the
# extension, and the workers registered with the coordinator.
cluster_database() { # database
    local database="$1" port
    for port in "${ports[@]}"; do
        if [[ -z "$(psql_on "$port" postgres -Atc "SELECT 1 FROM pg_database WHERE datname = '$database'")" ]]; then
            psql_on "$port" postgres -c "CREATE DATABASE \"$database\""
        fi
        psql_on "$port" "$database" -c "CREATE EXTENSION IF NOT EXISTS citus"
    done
    psql_on "${ports[0]}" "$database" <<SQL
SELECT citus_set_coordinator_host('127.0.0.1', ${ports[0]});
SELECT citus_add_node('127.0.0.1', ${ports[1]});
SELECT citus_add_node('127.0.0.1', ${ports[2]});
SQL
}

up() {
    check
    mkdir -p "$dir"
    if [[ "$(id -u)" == 0 ]]; then chown postgres:postgres "$dir"; fi
    local i
    for i in 0 1 2; do
        start_node "${names[$i]}" "${ports[$i]}"
    done
    cluster_database postgres >/dev/null
    cluster_database "$db" >/dev/null
    local url="postgres://postgres@127.0.0.1:${ports[0]}/$db"
    say "migrating $db"
    if [[ -n "${STAGEDOOR_BIN:-}" ]]; then
        DATABASE_URL="$url" "$STAGEDOOR_BIN" migrate >&2
    else
        DATABASE_URL="$url" cargo run --release --locked --quiet --bin stagedoor-checkout -- migrate >&2
    fi
    say "distributing the tables of $db"
    psql_on "${ports[0]}" "$db" -f scripts/citus-distribute.sql >/dev/null
    say "nodes: $(psql_on "${ports[0]}" "$db" -Atc "SELECT string_agg(nodeport::text, ', ' ORDER BY nodeport) FROM pg_dist_node")"
    echo "DATABASE_URL=$url"
}

drop() {
    local port
    for port in "${ports[@]}"; do
        psql_on "$port" postgres -c "DROP DATABASE IF EXISTS \"$db\" WITH (FORCE)"
    done
    say "dropped $db"
}

stop() {
    local i
    for i in 2 1 0; do
        if [[ -f "$dir/${names[$i]}/PG_VERSION" ]]; then
            as_server "$bindir/pg_ctl" -D "$dir/${names[$i]}" -m fast -w stop >/dev/null 2>&1 || true
        fi
    done
    say "stopped"
}

case "${1:-up}" in
up) up ;;
stop) stop ;;
drop) drop ;;
check) check ;;
*)
    say "usage: scripts/citus.sh [up|stop|drop|check]"
    exit 2
    ;;
esac
