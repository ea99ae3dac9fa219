#!/usr/bin/env bash
# A Citus cluster on this machine: a coordinator and two workers (or
# STAGEDOOR_CITUS_WORKERS), each its own `initdb` on a port of 127.0.0.1, from the Citus extension
# installed in the local PostgreSQL. When the extension is missing it is
# built from the unmodified source that ../shared/vendor holds (no package
# archive here carries Citus); nothing of Citus is ever part of this clone.
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
#   scripts/citus.sh install install the extension when it is missing: the
#                            vendored tarball (its sha256 checked), Debian's
#                            build packages, configure, make -j2, make
#                            install; exit 4 when the tarball is not there
#
# Environment: STAGEDOOR_CITUS_DIR (/var/tmp/stagedoor-citus), STAGEDOOR_CITUS_PORT
# (9700: the coordinator; the workers take the next ones), STAGEDOOR_CITUS_WORKERS
# (2: how many workers; a cluster keeps the number it was made with, so
# another number needs another STAGEDOOR_CITUS_DIR and port), STAGEDOOR_CITUS_DB
# (stagedoor), STAGEDOOR_BIN (the service binary; else `cargo run --release`),
# STAGEDOOR_CITUS_VENDOR (../shared/vendor), STAGEDOOR_CITUS_BUILD
# (/var/tmp/citus-build: kept, so a later run only installs).
#
# Every node also gets the extension and the node list in its `postgres`
# database, and two templates: the test profile (STAGEDOOR_TEST_CITUS=1,
# DATABASE_URL pointing at the coordinator) copies each test's database
# from stagedoor_cluster_template, or from stagedoor_cluster_laid_out, which
# also holds the service's tables, migrated and distributed.
set -euo pipefail
cd "$(dirname "$0")/.."

dir="${STAGEDOOR_CITUS_DIR:-/var/tmp/stagedoor-citus}"
base_port="${STAGEDOOR_CITUS_PORT:-9700}"
db="${STAGEDOOR_CITUS_DB:-stagedoor}"
workers="${STAGEDOOR_CITUS_WORKERS:-2}"
if ! [[ "$workers" =~ ^[1-9][0-9]?$ ]]; then
    printf 'citus: STAGEDOOR_CITUS_WORKERS must be a number of workers from 1 to 99, not %s\n' "$workers" >&2
    exit 2
fi
ports=("$base_port")
names=(coordinator)
for ((i = 1; i <= workers; i++)); do
    ports+=("$((base_port + i))")
    names+=("worker$i")
done

say() { printf 'citus: %s\n' "$*" >&2; }

# The one Citus this project builds: 13.0.x is the newest that compiles
# against Debian's PostgreSQL 15 (../shared/CITUS.md). The sum is the one
# ../shared/vendor/README.md gives.
citus_version=13.0.5
citus_sha256=b279cf8b0a0cda459653439ea61388f29e16800e23212ac55d4f17e158f61d40
vendor="${STAGEDOOR_CITUS_VENDOR:-../shared/vendor}"
tarball="$vendor/citus-$citus_version.tar.gz"
build="${STAGEDOOR_CITUS_BUILD:-/var/tmp/citus-build}"
build_packages=(build-essential postgresql-server-dev-15 libcurl4-openssl-dev liblz4-dev libzstd-dev libkrb5-dev)

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
        say "the Citus extension is not installed in $(pg_config --version) (no $libdir/citus.so); scripts/citus.sh install builds it from $tarball"
        return 3
    fi
}

apt_install() { # package...
    local missing=() package
    for package in "$@"; do
        dpkg-query -W -f='${Status}' "$package" 2>/dev/null | grep -q 'install ok installed' \
            || missing+=("$package")
    done
    [[ ${#missing[@]} -gt 0 ]] || return 0
    say "installing ${missing[*]}"
    if ! DEBIAN_FRONTEND=noninteractive apt-get -o DPkg::Lock::Timeout=600 install -y -qq "${missing[@]}" >&2; then
        # A machine whose package lists are stale or empty.
        apt-get -o DPkg::Lock::Timeout=600 update -q >&2
        DEBIAN_FRONTEND=noninteractive apt-get -o DPkg::Lock::Timeout=600 install -y -qq "${missing[@]}" >&2
    fi
}

# Runs a build step with its output in $build/build.log; on failure the end
# of that log goes to stderr and the script stops.
build_step() { # description command...
    local what="$1"
    shift
    say "$what"
    if ! "$@" >>"$build/build.log" 2>&1; then
        say "FAILED: $what (the last lines of $build/build.log follow)"
        tail -n 60 "$build/build.log" >&2
        exit 1
    fi
}

install() {
    if check 2>/dev/null; then
        return 0
    fi
    if [[ ! -f "$tarball" ]]; then
        say "no vendored Citus source at $tarball: cannot build the extension"
        return 4
    fi
    local sum
    sum="$(sha256sum "$tarball" | cut -d' ' -f1)"
    if [[ "$sum" != "$citus_sha256" ]]; then
        say "$tarball has sha256 $sum, not $citus_sha256: refusing to build it"
        exit 1
    fi
    [[ "$(id -u)" == 0 ]] || { say "installing the extension needs root (apt-get, make install)"; exit 1; }
    apt_install "${build_packages[@]}"
    bindir="$(pg_config --bindir)"
    mkdir -p "$build"
    # One build at a time: another checkout's CI may get here at once.
    exec 9>"$build/.lock"
    flock 9
    local source="$build/citus-$citus_version"
    # The marker names the tarball's sum and the server it was built for:
    # anything else is built again from a fresh extract.
    local marker="$source/.built-$citus_sha256-$(pg_config --version | tr -c 'A-Za-z0-9.\n' _)"
    if [[ ! -f "$marker" ]]; then
        rm -rf "$source"
        : >"$build/build.log"
        build_step "extracting $tarball into $build" tar -xzf "$tarball" -C "$build"
        [[ -d "$source" ]] || { say "$tarball did not extract into $source"; exit 1; }
        build_step "configuring Citus $citus_version" bash -c "cd '$source' && ./configure"
        build_step "building Citus $citus_version (make -j2, a few minutes)" make -C "$source" -j2
        touch "$marker"
    fi
    build_step "installing Citus $citus_version into $(pg_config --pkglibdir)" make -C "$source" install
    flock -u 9
    check
    say "Citus $citus_version installed"
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
# pg_stat_statements: the bench's Citus mode counts each node's statements
# per click with it.
shared_preload_libraries = 'citus,pg_stat_statements'
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
    {
        echo "SELECT citus_set_coordinator_host('127.0.0.1', ${ports[0]});"
        for port in "${ports[@]:1}"; do
            echo "SELECT citus_add_node('127.0.0.1', $port);"
        done
    } | psql_on "${ports[0]}" "$database"
}

# lay_out DATABASE: the service's migrations (STAGEDOOR_BIN's, else those
# of `cargo run --release`), then its tables distributed.
lay_out() {
    local url="postgres://postgres@127.0.0.1:${ports[0]}/$1"
    say "migrating $1"
    if [[ -n "${STAGEDOOR_BIN:-}" ]]; then
        DATABASE_URL="$url" "$STAGEDOOR_BIN" migrate >&2
    else
        DATABASE_URL="$url" cargo run --release --locked --quiet --bin stagedoor-checkout -- migrate >&2
    fi
    say "distributing the tables of $1"
    psql_on "${ports[0]}" "$1" -f scripts/citus-distribute.sql >/dev/null
}

# closed_for_copies DATABASE: no connection may stay in a database that is
# copied, not even Citus's maintenance daemon, which refused connections
# keep from coming back.
closed_for_copies() {
    local port
    for port in "${ports[@]}"; do
        psql_on "$port" postgres -Atc "SET client_min_messages = error" \
            -c "ALTER DATABASE $1 WITH ALLOW_CONNECTIONS false" \
            -c "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity WHERE datname = '$1'" >/dev/null
    done
}

# The databases that the test profile copies each test's database from, on
# every node (test-support's citus::TEMPLATE and citus::LAID_OUT): the
# extension and the node list; and a copy of that with the service's
# tables migrated and distributed. A copy per test is a file copy, instead
# of seconds of CREATE EXTENSION, citus_add_node and DDL on every node.
# Made again at every start, for the extension and the migrations of now.
template=stagedoor_cluster_template
laid_out=stagedoor_cluster_laid_out
cluster_templates() {
    local port
    for port in "${ports[@]}"; do
        psql_on "$port" postgres -c "DROP DATABASE IF EXISTS $laid_out WITH (FORCE)" \
            -c "DROP DATABASE IF EXISTS $template WITH (FORCE)"
    done
    cluster_database "$template"
    closed_for_copies "$template"
    for port in "${ports[@]}"; do
        psql_on "$port" postgres -c "CREATE DATABASE $laid_out TEMPLATE $template"
    done
    lay_out "$laid_out"
    closed_for_copies "$laid_out"
}

up() {
    install
    mkdir -p "$dir"
    if [[ "$(id -u)" == 0 ]]; then chown postgres:postgres "$dir"; fi
    # Its node lists are in every template: a cluster keeps its number of
    # workers.
    if [[ -f "$dir/workers" && "$(cat "$dir/workers")" != "$workers" ]]; then
        say "$dir was made with $(cat "$dir/workers") workers, not $workers: stop it and remove $dir, or set STAGEDOOR_CITUS_DIR and STAGEDOOR_CITUS_PORT for another cluster"
        exit 2
    fi
    local i
    for i in "${!names[@]}"; do
        start_node "${names[$i]}" "${ports[$i]}"
    done
    echo "$workers" >"$dir/workers"
    cluster_database postgres >/dev/null
    cluster_templates >/dev/null
    cluster_database "$db" >/dev/null
    lay_out "$db"
    say "nodes: $(psql_on "${ports[0]}" "$db" -Atc "SELECT string_agg(nodeport::text, ', ' ORDER BY nodeport) FROM pg_dist_node")"
    echo "DATABASE_URL=postgres://postgres@127.0.0.1:${ports[0]}/$db"
}

drop() {
    local port
    for port in "${ports[@]}"; do
        psql_on "$port" postgres -c "DROP DATABASE IF EXISTS \"$db\" WITH (FORCE)"
    done
    say "dropped $db"
}

stop() {
    local node
    # The workers first, however many, then the coordinator.
    for node in "$dir"/worker* "$dir/coordinator"; do
        if [[ -f "$node/PG_VERSION" ]]; then
            as_server "$bindir/pg_ctl" -D "$node" -m fast -w stop >/dev/null 2>&1 || true
        fi
    done
    say "stopped"
}

case "${1:-up}" in
up) up ;;
stop) stop ;;
drop) drop ;;
check) check ;;
install) install ;;
*)
    say "usage: scripts/citus.sh [up|stop|drop|check|install]"
    exit 2
    ;;
esac
