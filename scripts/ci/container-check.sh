#!/usr/bin/env bash
# Proves the container deliverables still work, on a real Docker engine: the
# image builds, runs as uid 10001, has a HEALTHCHECK, and its service binary
# has no Payrail sandbox and refuses one in production; it holds none of the
# repository's secrets and no development layer; the compose stack publishes
# its ports on 127.0.0.1 only, comes up healthy on secrets of its own (a
# token signed with the repository's dev secret is refused 401), passes
# scripts/smoke.sh, and every container exits 0 on its stop signal.
#
#   scripts/ci/container-check.sh        (as root; .ci/run runs it)
#
# No registry is reachable from this kind of machine (../shared/NOTES.md), so
# what a registry would give is made here, each part only when it is missing:
#   - Debian's docker.io, started on a socket and data root of its own under
#     /var/tmp and left running: its images are the build cache, so a run
#     after a source-only change costs about a minute (a cold one, 10-15);
#   - the base images that the Dockerfile's FROM lines and the compose file's
#     image: lines name: debian:<suite>-slim from debootstrap, and stand-ins
#     for rust:<version>-slim-<suite> (this machine's toolchain) and
#     postgres:<n> (Debian's PostgreSQL).
# It relies on nothing inside the Dockerfile but those FROM lines and where
# the image keeps its binaries (/usr/local/bin): on the compose file, the
# image's behaviour and scripts/smoke.sh.
#
# One line per step; on a failure, the step's log or the containers' logs,
# the stack taken down, and a non-zero exit. Stop the engine with
#   kill "$(cat /var/tmp/stagedoor-docker.pid)"
#
# Environment:
#   DOCKER_HOST   an engine to use instead of starting one (when it answers)
set -euo pipefail
cd "$(dirname "$0")/../.."

state=/var/tmp/stagedoor-docker # socket, data root, pid file and log of our engine
compose_file=docker-compose.yml
# A project name of its own: never touches a stack someone runs by hand.
project=stagedoor-container-check
health_timeout=240 # seconds from `up` to every health check healthy
smoke_url=http://127.0.0.1:8080

# Classic builder: its cache is plain images in the data root, which is what
# persists between runs and what the pruning at the end reasons about.
export DOCKER_BUILDKIT=0 COMPOSE_DOCKER_CLI_BUILD=0 DEBIAN_FRONTEND=noninteractive

started=$SECONDS
work=""
in_step=0
stack_up=0

step() {
    step_started=$SECONDS
    in_step=1
    printf '%-12s ' "$1"
}

step_done() {
    printf '%s (%d s)\n' "$*" $((SECONDS - step_started))
    in_step=0
}

fail() {
    if [ "$in_step" = 1 ]; then
        printf 'FAILED\n'
        in_step=0
    fi
    printf 'FAIL: %s\n' "$*" >&2
    exit 1
}

# logged NAME CMD...: CMD's output goes to $work/NAME.log, shown (its end)
# only when CMD fails, so that a passing run stays one line per step.
logged() {
    local name=$1
    shift
    if ! "$@" >>"$work/$name.log" 2>&1; then
        [ "$in_step" = 1 ] && printf 'FAILED\n' && in_step=0
        printf -- '--- %s (last 80 lines of %s)\n' "$*" "$work/$name.log" >&2
        tail -n 80 "$work/$name.log" >&2
        fail "$*"
    fi
}

compose_cmd=(docker-compose --ansi never -f "$compose_file" -p "$project")
compose() { "${compose_cmd[@]}" "$@"; }

cleanup() {
    local status=$?
    trap - EXIT
    set +e
    if [ "$stack_up" = 1 ]; then
        echo "--- containers"
        compose ps
        echo "--- their logs (last 60 lines each)"
        compose logs --no-color --tail=60
        compose down -v --remove-orphans >/dev/null 2>&1
    fi
    if [ -n "$work" ]; then
        # debootstrap mounts /proc and /sys inside its target; a failed run
        # can leave them there, and rm must not walk into them.
        awk -v p="$work/" 'index($2, p) == 1 { print $2 }' /proc/mounts | sort -r |
            while read -r m; do umount -l "$m"; done
        rm -rf --one-file-system "$work"
    fi
    [ "$status" -eq 0 ] || echo "container check FAILED (exit $status)" >&2
    exit "$status"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

[ "$(id -u)" = 0 ] || fail "needs root (apt-get, dockerd, debootstrap)"
# Not /tmp: debootstrap and the toolchain's copy need a few GB of real disk.
work="$(mktemp -d /var/tmp/stagedoor-container-check.XXXXXX)"

# Two runs at once would fight over the ports, the project and the engine's
# start: the second one waits.
exec 9>"$state.lock"
if ! flock -n 9; then
    echo "another container check is running; waiting for it (up to 30 min)"
    flock -w 1800 9 || fail "the other container check still runs after 30 min"
fi

# --- 1. Tools, from Debian, only when missing.
step "tools"
missing=()
command -v dockerd >/dev/null || missing+=(docker.io)
command -v debootstrap >/dev/null || missing+=(debootstrap)
command -v docker-compose >/dev/null || missing+=(docker-compose)
if [ "${#missing[@]}" -gt 0 ]; then
    # An install from empty package lists finds nothing: refresh them only then.
    # Another install (the Citus build's, say) may hold dpkg's lock: wait for it.
    apt=(apt-get -o DPkg::Lock::Timeout=600)
    if ! "${apt[@]}" install -y -q --no-install-recommends "${missing[@]}" >>"$work/apt.log" 2>&1; then
        logged apt "${apt[@]}" update -q
        logged apt "${apt[@]}" install -y -q --no-install-recommends "${missing[@]}"
    fi
    step_done "installed ${missing[*]}"
else
    step_done "dockerd, debootstrap and docker-compose already there"
fi

# --- 2. An engine: the caller's, or ours, started when it is not running.
step "engine"
engine_version() { timeout 20 docker version --format '{{.Server.Version}}' 2>/dev/null; }
# The caller's engine, ours from an earlier run, or the system's; a second
# dockerd beside the system's would fight it over the docker0 bridge.
engine=""
for candidate in "${DOCKER_HOST:-}" "unix://$state.sock" unix:///var/run/docker.sock; do
    [ -n "$candidate" ] || continue
    if version="$(DOCKER_HOST="$candidate" engine_version)"; then
        engine="$candidate"
        break
    fi
done
if [ -n "$engine" ]; then
    export DOCKER_HOST="$engine"
    step_done "Docker $version at $DOCKER_HOST (already running)"
else
    export DOCKER_HOST="unix://$state.sock"
    rm -f "$state.sock" # left by an engine that died, or by a reboot
    mkdir -p "$state-data"
    # nice: the image builds run inside the engine, not under this script,
    # and must not crowd out everything else on 2 cores. setsid, and no
    # inherited descriptors (fd 9 is the lock): it outlives this run, and
    # must not hold CI's output open.
    setsid nice -n 10 dockerd -H "$DOCKER_HOST" --data-root "$state-data" \
        --pidfile "$state.pid" </dev/null >>"$state.log" 2>&1 9>&- &
    version=""
    for _ in $(seq 1 60); do
        version="$(engine_version)" && break
        sleep 1
    done
    if [ -z "$version" ]; then
        printf 'FAILED\n--- %s (last 40 lines)\n' "$state.log" >&2
        tail -n 40 "$state.log" >&2
        in_step=0
        fail "dockerd did not answer on $DOCKER_HOST within 60 s"
    fi
    step_done "Docker $version at $DOCKER_HOST (started, pid $(cat "$state.pid"), log $state.log)"
fi

# A stack left by an interrupted run would hold the ports and the volume.
compose down -v --remove-orphans >/dev/null 2>&1 || true

# --- 3. The base images, read from the compose file and its Dockerfiles.
# compose_facts: one line per fact of the resolved compose file:
#   build SERVICE IMAGE DOCKERFILE   a service built here (IMAGE may be "-")
#   pull SERVICE IMAGE               a service run from a registry image
#   port SERVICE PORT HOST_IP        a port published on the host ("-": every
#                                    interface)
#   service SERVICE                  a service that `up` starts
# Services of a profile (the `observe` profile's Prometheus and Grafana) are
# left out: `up` starts them only when their profile is named, which this
# check never does, and their registry images are not here. `config` lists
# them all the same.
# /usr/bin/python3: Debian's docker-compose runs on it, so it has PyYAML.
compose_facts() {
    compose config | /usr/bin/python3 -c '
import os, sys, yaml
services = yaml.safe_load(sys.stdin).get("services") or {}
for name, svc in sorted(services.items()):
    if svc.get("profiles"):
        continue
    print("service", name)
    build = svc.get("build")
    if build is not None:
        if isinstance(build, str):
            build = {"context": build}
        dockerfile = os.path.join(build.get("context", "."), build.get("dockerfile", "Dockerfile"))
        print("build", name, svc.get("image") or "-", dockerfile)
    elif svc.get("image"):
        print("pull", name, svc["image"])
    for port in svc.get("ports") or []:
        if isinstance(port, dict):
            published, host_ip = port.get("published"), port.get("host_ip")
        else:
            parts = str(port).split("/")[0].split(":")
            published = parts[-2] if len(parts) > 1 else None
            host_ip = parts[0] if len(parts) > 2 else None
        if published:
            print("port", name, published, host_ip or "-")
'
}

# from_images DOCKERFILE: the images its FROM lines name, without its own
# stages (FROM chef AS planner) and scratch.
from_images() {
    awk '
        toupper($1) == "FROM" {
            image = ""
            for (i = 2; i <= NF; i++) if ($i !~ /^--/) { image = $i; break }
            if (image != "" && !(tolower(image) in stages) && image != "scratch") print image
            for (i = 2; i < NF; i++) if (toupper($i) == "AS") stages[tolower($(i + 1))] = 1
        }' "$1"
}

# debian_sources: "URI SUITE" for every Debian-format source apt has here,
# one-line (sources.list) and deb822 (*.sources) alike.
debian_sources() {
    local f
    for f in /etc/apt/sources.list /etc/apt/sources.list.d/*.list; do
        [ -r "$f" ] || continue
        awk '$1 == "deb" {
            i = 2
            if ($i ~ /^\[/) { while (i <= NF && $i !~ /\]$/) i++; i++ }
            print $i, $(i + 1)
        }' "$f"
    done
    for f in /etc/apt/sources.list.d/*.sources; do
        [ -r "$f" ] || continue
        awk '
            function flush(u, s) {
                if (deb && enabled) for (u in uris) for (s in suites) print uris[u], suites[s]
                deb = 0; enabled = 1; split("", uris); split("", suites)
            }
            BEGIN { enabled = 1 }
            /^[[:space:]]*$/ { flush(); next }
            /^#/ { next }
            tolower($1) == "types:" { for (i = 2; i <= NF; i++) if ($i == "deb") deb = 1 }
            tolower($1) == "enabled:" && tolower($2) == "no" { enabled = 0 }
            tolower($1) == "uris:" { for (i = 2; i <= NF; i++) uris[i] = $i }
            tolower($1) == "suites:" { for (i = 2; i <= NF; i++) suites[i] = $i }
            END { flush() }' "$f"
    done
}

# mirror_for SUITE: the first source apt uses for SUITE ("" when none).
mirror_for() {
    debian_sources | awk -v s="$1" '$2 == s { print $1; exit }'
}

have_image() { docker image inspect "$1" >/dev/null 2>&1; }

# Bumped when make_postgres's stand-in changes (2: POSTGRES_PASSWORD_FILE), so
# that an engine's older one is made again.
postgres_standin_version=2
label() { docker image inspect -f "{{index .Config.Labels \"$2\"}}" "$1" 2>/dev/null; }
# stale_standin IMAGE: a PostgreSQL stand-in made by an older version of
# this script (a registry's image has no stand-in label, and is kept).
stale_standin() {
    case "$1" in
        postgres:*)
            [ -n "$(label "$1" org.stagedoor.stand-in)" ] &&
                [ "$(label "$1" org.stagedoor.stand-in.version)" != "$postgres_standin_version" ]
            ;;
        *) return 1 ;;
    esac
}

# make_debian SUITE TAG: a minimal Debian imported as TAG, with apt pointed
# at the same mirrors as this machine's apt.
make_debian() {
    local suite=$1 tag=$2 mirror security rootfs
    mirror="$(mirror_for "$suite")"
    [ -n "$mirror" ] || fail "no Debian mirror for $suite in /etc/apt/sources.list*: cannot debootstrap $tag"
    security="$(mirror_for "$suite-security")"
    rootfs="$work/rootfs-$suite"
    logged debootstrap nice -n 10 debootstrap --variant=minbase "$suite" "$rootfs" "$mirror"
    rm -f "$rootfs/etc/apt/sources.list"
    {
        printf 'Types: deb\nURIs: %s\nSuites: %s' "$mirror" "$suite"
        [ -n "$(mirror_for "$suite-updates")" ] && printf ' %s' "$suite-updates"
        printf '\nComponents: main\nSigned-By: /usr/share/keyrings/debian-archive-keyring.gpg\n'
        if [ -n "$security" ]; then
            printf '\nTypes: deb\nURIs: %s\nSuites: %s\n' "$security" "$suite-security"
            printf 'Components: main\nSigned-By: /usr/share/keyrings/debian-archive-keyring.gpg\n'
        fi
    } >"$rootfs/etc/apt/sources.list.d/debian.sources"
    # Slim: no manuals or docs now or from later installs (copyrights stay).
    cat >"$rootfs/etc/dpkg/dpkg.cfg.d/slim" <<'EOF'
path-exclude /usr/share/doc/*
path-include /usr/share/doc/*/copyright
path-exclude /usr/share/man/*
path-exclude /usr/share/info/*
EOF
    find "$rootfs/usr/share/doc" -mindepth 1 ! -type d ! -name copyright -delete
    rm -rf "$rootfs/usr/share/man/"* "$rootfs/usr/share/info/"* \
        "$rootfs/var/lib/apt/lists/"* "$rootfs/var/cache/apt/"*.bin "$rootfs/var/cache/apt/archives/"*.deb
    tar --numeric-owner -C "$rootfs" -c . |
        logged import docker import --change 'CMD ["bash"]' - "$tag"
    rm -rf --one-file-system "$rootfs"
}

# make_rust VERSION SUITE TAG: the official image's layout (RUSTUP_HOME,
# CARGO_HOME, PATH) with this machine's rustc VERSION copied in.
make_rust() {
    local version=$1 suite=$2 tag=$3 rustup_home="${RUSTUP_HOME:-$HOME/.rustup}"
    local cargo_home="${CARGO_HOME:-$HOME/.cargo}" dir toolchain="" triple ctx link
    for dir in "$rustup_home"/toolchains/*/; do
        if "$dir/bin/rustc" --version 2>/dev/null | grep -q "^rustc $version "; then
            toolchain="$(realpath "$dir")"
            break
        fi
    done
    [ -n "$toolchain" ] ||
        fail "$tag: no Rust $version toolchain under $rustup_home/toolchains to copy in (rustup toolchain install $version)"
    triple="$("$toolchain/bin/rustc" -vV | awk '$1 == "host:" { print $2 }')"
    ctx="$work/rust"
    mkdir -p "$ctx/rustup/toolchains/$version-$triple" "$ctx/cargo/bin"
    # Without its HTML docs (800 MB), which the official slim image lacks too.
    tar -C "$toolchain" --exclude=./share/doc -c . | tar -C "$ctx/rustup/toolchains/$version-$triple" -x
    cp "$cargo_home/bin/rustup" "$ctx/cargo/bin/"
    for link in "$toolchain"/bin/*; do
        ln -s rustup "$ctx/cargo/bin/$(basename "$link")"
    done
    cat >"$ctx/rustup/settings.toml" <<EOF
version = "12"
default_toolchain = "$version-$triple"
profile = "minimal"
auto_self_update = "disable"
EOF
    # This machine's roots: with Debian's bundle alone, TLS to crates.io
    # fails from here (cargo install in the Dockerfile needs it).
    cp /etc/ssl/certs/ca-certificates.crt "$ctx/"
    # Writable by any build user, as in the official image; set here, since
    # a chmod in a RUN would copy the whole toolchain into a second layer.
    chmod -R a+w "$ctx/rustup" "$ctx/cargo"
    cat >"$ctx/Dockerfile" <<EOF
FROM debian:$suite-slim
RUN apt-get update \\
    && apt-get install -y --no-install-recommends ca-certificates gcc libc6-dev pkg-config \\
    && rm -rf /var/lib/apt/lists/*
COPY ca-certificates.crt /etc/ssl/certs/ca-certificates.crt
COPY rustup /usr/local/rustup
COPY cargo /usr/local/cargo
ENV RUSTUP_HOME=/usr/local/rustup \\
    CARGO_HOME=/usr/local/cargo \\
    PATH=/usr/local/cargo/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \\
    RUST_VERSION=$version
RUN rustc --version && cargo --version
LABEL org.stagedoor.stand-in="$tag from this machine's toolchain (scripts/ci/container-check.sh)"
EOF
    logged "standin-rust" docker build --force-rm -t "$tag" "$ctx"
    rm -rf "$ctx"
}

# make_postgres SUITE TAG: Debian's PostgreSQL with an entrypoint that
# behaves like the official image's where compose relies on it: on first
# start, a cluster in PGDATA (/var/lib/postgresql/data) whose superuser is
# POSTGRES_USER with POSTGRES_PASSWORD, the database POSTGRES_DB; then
# postgres as PID 1 on every interface, password auth from the network.
# POSTGRES_PASSWORD_FILE, as the official image, reads the password from a
# file.
make_postgres() {
    local suite=$1 tag=$2 ctx="$work/postgres"
    mkdir -p "$ctx"
    cat >"$ctx/entrypoint.sh" <<'EOF'
#!/bin/sh
set -eu
if [ "${1#-}" != "${1:-}" ]; then set -- postgres "$@"; fi
if [ "${1:-}" != postgres ]; then exec "$@"; fi
if [ "$(id -u)" = 0 ]; then
    mkdir -p "$PGDATA" /run/postgresql
    chown -R postgres:postgres "$PGDATA" /run/postgresql
    chmod 700 "$PGDATA"
    exec setpriv --reuid=postgres --regid=postgres --init-groups "$0" "$@"
fi
shift
user="${POSTGRES_USER:-postgres}"
db="${POSTGRES_DB:-$user}"
if [ -n "${POSTGRES_PASSWORD_FILE:-}" ]; then
    POSTGRES_PASSWORD="$(cat "$POSTGRES_PASSWORD_FILE")"
fi
if [ ! -s "$PGDATA/PG_VERSION" ]; then
    if [ -z "${POSTGRES_PASSWORD:-}" ]; then
        echo "POSTGRES_PASSWORD is empty: refusing to create a database anyone can log in to" >&2
        exit 1
    fi
    pwfile="$(mktemp)"
    printf '%s\n' "$POSTGRES_PASSWORD" >"$pwfile"
    initdb -D "$PGDATA" --username="$user" --pwfile="$pwfile" --encoding=UTF8 \
        --locale=C.UTF-8 --auth-local=trust --auth-host=scram-sha-256
    rm -f "$pwfile"
    echo 'host all all all scram-sha-256' >>"$PGDATA/pg_hba.conf"
    echo "listen_addresses = '*'" >>"$PGDATA/postgresql.conf"
    if [ "$db" != postgres ]; then
        # On a private socket and no TCP: the health check (pg_isready on
        # the usual socket) stays red until the database exists.
        sock="$(mktemp -d)"
        pg_ctl -D "$PGDATA" -w -o "-c listen_addresses='' -k $sock" start
        echo 'CREATE DATABASE :"db";' | psql -v ON_ERROR_STOP=1 -h "$sock" -U "$user" -d postgres -v db="$db"
        pg_ctl -D "$PGDATA" -w -m fast stop
        rmdir "$sock"
    fi
fi
exec postgres -D "$PGDATA" "$@"
EOF
    chmod 755 "$ctx/entrypoint.sh"
    cat >"$ctx/Dockerfile" <<EOF
FROM debian:$suite-slim
# No cluster from the package: the entrypoint makes one in PGDATA. The
# server's programs go on the PATH (pg_isready for the health check).
RUN apt-get update \\
    && apt-get install -y --no-install-recommends postgresql-common \\
    && sed -ri 's/^#?[[:space:]]*create_main_cluster.*/create_main_cluster = false/' /etc/postgresql-common/createcluster.conf \\
    && apt-get install -y --no-install-recommends postgresql \\
    && rm -rf /var/lib/apt/lists/* \\
    && ln -s /usr/lib/postgresql/*/bin/* /usr/local/bin/ \\
    && mkdir -p /var/lib/postgresql/data /run/postgresql \\
    && chown postgres:postgres /var/lib/postgresql/data /run/postgresql
COPY entrypoint.sh /usr/local/bin/docker-entrypoint.sh
ENV PGDATA=/var/lib/postgresql/data
VOLUME /var/lib/postgresql/data
EXPOSE 5432
# Fast shutdown: clients are disconnected, and postgres exits 0.
STOPSIGNAL SIGINT
ENTRYPOINT ["docker-entrypoint.sh"]
CMD ["postgres"]
LABEL org.stagedoor.stand-in="$tag from Debian $suite's PostgreSQL (scripts/ci/container-check.sh)" \\
      org.stagedoor.stand-in.version="$postgres_standin_version"
EOF
    logged "standin-postgres" docker build --force-rm -t "$tag" "$ctx"
    rm -rf "$ctx"
}

facts="$(compose_facts)" || fail "docker-compose config failed on $compose_file"

# check_ports: fail when something on the host already has a port that the
# stack publishes (the stack's own, from an interrupted run, is down by now).
check_ports() {
    local port
    for port in "${ports[@]}"; do
        if (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null; then
            fail "something already listens on 127.0.0.1:$port; stop it, the compose stack publishes that port"
        fi
    done
}
step "ports"
mapfile -t ports < <(awk '$1 == "port" { print $3 }' <<<"$facts" | sort -un)
# Nothing of a development stack on the host's other interfaces (the
# sandbox's fault switches and ledger need no key), unless asked for.
if [ -z "${STAGEDOOR_BIND:-}" ]; then
    exposed="$(awk '$1 == "port" && $4 != "127.0.0.1" { printf "%s %s:%s; ", $2, $4, $3 }' <<<"$facts")"
    [ -z "$exposed" ] || fail "$compose_file publishes beyond 127.0.0.1: ${exposed%; }"
fi
check_ports
step_done "${ports[*]:-none} free, on 127.0.0.1 only"

step "base images"
built_image="$(awk '$1 == "build" { print $3; exit }' <<<"$facts")"
[ -n "$built_image" ] || fail "$compose_file builds no service: nothing to check"
[ "$built_image" != - ] || built_image="${project}_$(awk '$1 == "build" { print $2; exit }' <<<"$facts")"
mapfile -t dockerfiles < <(awk '$1 == "build" { print $4 }' <<<"$facts" | sort -u)
host_suite="$(sed -n 's/^VERSION_CODENAME=//p' /etc/os-release)"
bases=()
for dockerfile in "${dockerfiles[@]}"; do
    [ -r "$dockerfile" ] || fail "$dockerfile (from $compose_file) is not there"
    mapfile -t -O "${#bases[@]}" bases < <(from_images "$dockerfile")
done
mapfile -t -O "${#bases[@]}" bases < <(awk '$1 == "pull" { print $3 }' <<<"$facts")
# Debian first: the stand-ins are built on it.
mapfile -t bases < <(printf '%s\n' "${bases[@]}" | sort -u | awk '/^debian:/ { print; next } { rest[++n] = $0 } END { for (i = 1; i <= n; i++) print rest[i] }')
report=()
for image in "${bases[@]}"; do
    case "$image" in *'$'*) fail "FROM $image: build arguments in FROM are not resolved here" ;; esac
    if have_image "$image" && ! stale_standin "$image"; then
        report+=("$image present")
        continue
    fi
    tag="${image#*:}"
    case "$image" in
        debian:*)
            make_debian "${tag%-slim}" "$image"
            ;;
        rust:*-slim-*)
            suite="${tag##*-slim-}"
            if ! have_image "debian:$suite-slim"; then make_debian "$suite" "debian:$suite-slim"; fi
            make_rust "${tag%%-*}" "$suite" "$image"
            ;;
        postgres:*)
            if ! have_image "debian:$host_suite-slim"; then make_debian "$host_suite" "debian:$host_suite-slim"; fi
            make_postgres "$host_suite" "$image"
            image="$image (PostgreSQL $(docker run --rm --entrypoint sh "$image" -c 'ls /usr/lib/postgresql'))"
            ;;
        *)
            fail "$image is not here, no registry is reachable, and this script knows no way to make it"
            ;;
    esac
    report+=("$image made")
done
joined="$(printf '%s, ' "${report[@]}")"
step_done "${joined%, }"

# --- 4. The image, and what an orchestrator relies on in it.
step "build"
logged build nice -n 10 "${compose_cmd[@]}" build --force-rm
step_done "$built_image"

step "image"
user="$(docker image inspect -f '{{.Config.User}}' "$built_image")"
[ "${user%%:*}" = 10001 ] || fail "$built_image: USER is '${user:-(none, root)}', expected 10001 (numeric)"
healthcheck="$(docker image inspect -f '{{if .Config.Healthcheck}}{{join .Config.Healthcheck.Test " "}}{{end}}' "$built_image")"
case "$healthcheck" in
    "" | NONE*) fail "$built_image: no HEALTHCHECK" ;;
esac
size="$(docker image inspect -f '{{.Size}}' "$built_image")"
size_mb="$(awk -v b="$size" 'BEGIN { printf "%.1f", b / 1000000 }')"
step_done "$built_image: $size_mb MB, USER $user, HEALTHCHECK ${healthcheck#CMD }"

step "no sandbox"
# The service cannot fake a charge: its binary is built without the embedded
# Payrail sandbox (whose fault switch, drop_after_charge, is in the sandbox's
# binary only), and in production it refuses payrail.sandbox = true at once.
if docker run --rm --entrypoint grep "$built_image" -q drop_after_charge /usr/local/bin/stagedoor-checkout; then
    fail "$built_image: /usr/local/bin/stagedoor-checkout embeds the Payrail sandbox"
fi
if refusal="$(docker run --rm -e STAGEDOOR__PAYRAIL__SANDBOX=true "$built_image" serve 2>&1)"; then
    fail "$built_image: serve started in production with payrail.sandbox = true"
fi
grep -q 'payrail\.sandbox' <<<"$refusal" || fail "the refusal does not name payrail.sandbox: $refusal"
step_done "the service binary has no sandbox; production refuses payrail.sandbox = true"

step "no secrets"
# The repository's development secrets (config/local.toml's): no file of the
# image may hold one, nor the layer that sets them. payrail-sandbox's binary
# aside: its documented default API key is local.toml's, and opens nothing
# but a sandbox, which never moves money.
mapfile -t dev_secrets < <(sed -nE 's/^(jwt_secret|api_key|webhook_secret) = "(.+)"$/\2/p' config/local.toml)
[ "${#dev_secrets[@]}" -ge 3 ] || fail "config/local.toml: expected its three dev secrets, found ${#dev_secrets[@]}"
# As root, so that no file is left unread; grep's status says nothing here
# (2 for any unreadable file, matches or not), its list of files does.
found="$(printf '%s\n' "${dev_secrets[@]}" | docker run --rm -i --user 0 --entrypoint sh "$built_image" -c \
    'grep -rlasF --exclude=payrail-sandbox -f /dev/stdin /usr /app /etc /opt /root /home /var || true')"
[ -z "$found" ] || fail "$built_image holds a secret of the repository, in: ${found//$'\n'/ }"
for layer in local test; do
    if docker run --rm --entrypoint test "$built_image" -e "/app/config/$layer.toml"; then
        fail "$built_image ships config/$layer.toml"
    fi
done
if refusal="$(docker run --rm -e STAGEDOOR_ENV=local "$built_image" token --sub smoke 2>&1)"; then
    fail "$built_image: STAGEDOOR_ENV=local minted a token (a development layer is built in)"
fi
grep -q 'STAGEDOOR_ENV=local has no layer' <<<"$refusal" || fail "STAGEDOOR_ENV=local: unexpected refusal: $refusal"
step_done "none of config/local.toml's secrets in any file (payrail-sandbox aside); STAGEDOOR_ENV=local refused"

# --- 5. The stack: up, healthy, the smoke test, stopped, down.
step "up"
check_ports # again: the build took minutes
stack_up=1
logged up timeout 600 "${compose_cmd[@]}" up -d --no-build
mapfile -t services < <(awk '$1 == "service" { print $2 }' <<<"$facts")
deadline=$((SECONDS + health_timeout))
while :; do
    mapfile -t containers < <(compose ps -q)
    pending=()
    for id in "${containers[@]}"; do
        info="$(docker inspect -f \
            '{{.Name}} {{.State.Status}} {{if .State.Health}}{{.State.Health.Status}}{{else}}none{{end}} {{.State.ExitCode}}' "$id")" ||
            fail "container $id disappeared"
        read -r name status health code <<<"$info"
        name="${name#/}"
        case "$status/$health" in
            running/healthy | running/none) ;;
            running/*) pending+=("$name $health") ;;
            # A one-shot job (the stack's secrets) that has done its work.
            exited/none) [ "$code" = 0 ] || fail "container $name exited with status $code" ;;
            *) fail "container $name is $status (health: $health)" ;;
        esac
        [ "$health" != unhealthy ] || fail "container $name is unhealthy"
    done
    if [ "${#containers[@]}" -ge "${#services[@]}" ] && [ "${#pending[@]}" -eq 0 ]; then
        break
    fi
    [ "$SECONDS" -lt "$deadline" ] ||
        fail "not healthy after ${health_timeout} s: ${pending[*]:-} (${#containers[@]} of ${#services[@]} services have a container)"
    sleep 2
done
# The uid the image's processes really run as, whatever its USER says.
built_id="$(docker image inspect -f '{{.Id}}' "$built_image")"
ours=()
for id in "${containers[@]}"; do
    [ "$(docker inspect -f '{{.Image}}' "$id")" = "$built_id" ] || continue
    [ "$(docker inspect -f '{{.State.Running}}' "$id")" = true ] || continue
    service="$(docker inspect -f '{{index .Config.Labels "com.docker.compose.service"}}' "$id")"
    pid="$(docker inspect -f '{{.State.Pid}}' "$id")"
    uid="$(awk '$1 == "Uid:" { print $2 }' "/proc/$pid/status" 2>/dev/null)" ||
        uid="$(docker exec "$id" id -u)"
    [ "$uid" = 10001 ] || fail "$service runs as uid $uid, expected 10001"
    ours+=("$service")
done
[ "${#ours[@]}" -gt 0 ] || fail "no container runs $built_image"
step_done "${#containers[@]} containers healthy (${services[*]}); ${ours[*]} run as uid 10001"

step "smoke"
token="$(timeout 60 "${compose_cmd[@]}" exec -T checkout stagedoor-checkout token --sub smoke)" ||
    fail "minting a token: docker-compose exec -T checkout stagedoor-checkout token --sub smoke"
token="$(printf '%s' "$token" | tr -d '[:space:]')"
[ -n "$token" ] || fail "stagedoor-checkout token --sub smoke printed nothing"
SMOKE_TOKEN="$token" logged smoke scripts/smoke.sh "$smoke_url"
step_done "$(tail -n 1 "$work/smoke.log")"

step "dev secret"
# A token the repository's dev secret signs, minted by the image's own
# `token` command: the stack, on secrets of its own, must refuse it.
dev_jwt_secret="$(sed -nE 's/^jwt_secret = "(.+)"$/\1/p' config/local.toml)"
forged="$(docker run --rm -e STAGEDOOR_ENV=compose -e STAGEDOOR__AUTH__JWT_SECRET="$dev_jwt_secret" \
    "$built_image" token --sub smoke)" || fail "minting a token with config/local.toml's jwt_secret"
status="$(curl -s -o /dev/null -w '%{http_code}' -H "Authorization: Bearer $forged" "$smoke_url/events/demo/seats")"
[ "$status" = 401 ] || fail "a token signed with config/local.toml's jwt_secret got $status, expected 401"
status="$(curl -s -o /dev/null -w '%{http_code}' -H "Authorization: Bearer $token" "$smoke_url/events/demo/seats")"
[ "$status" = 200 ] || fail "the stack's own token got $status on the seat map, expected 200"
step_done "a token signed with the repository's dev secret: 401; the stack's own: 200"

step "stop"
# No -t: each service's stop_grace_period (the service drains for up to 30 s).
logged stop timeout 180 "${compose_cmd[@]}" stop
codes=()
for id in "${containers[@]}"; do
    info="$(docker inspect -f '{{index .Config.Labels "com.docker.compose.service"}} {{.State.Status}} {{.State.ExitCode}}' "$id")" ||
        fail "container $id disappeared"
    read -r name status code <<<"$info"
    [ "$status" = exited ] || fail "container $name is $status after docker-compose stop"
    [ "$code" = 0 ] || fail "container $name exited with status $code on its stop signal (expected 0)"
    codes+=("$name")
done
step_done "every container exited 0: ${codes[*]}"

step "down"
logged down compose down -v --remove-orphans
stack_up=0
step_done "containers, network and volumes removed"

# --- 6. The cache: keep every image this run's build used, drop the
# untagged ones earlier builds left behind (each source change leaves a few
# hundred MB). Pruning by age would also drop layers still in use when the
# sources have not changed for a while.
step "cache"
keep="$(grep -oE -- '^ ---> [0-9a-f]{12}$' "$work/build.log" | awk '{ print $2 }' | sort -u)"
removed=0
if [ -n "$keep" ]; then
    while read -r id; do
        grep -qx "$id" <<<"$keep" && continue
        docker rmi "$id" >/dev/null 2>&1 && removed=$((removed + 1))
    done < <(docker images -q --filter dangling=true)
fi
step_done "$removed stale image(s) removed; $(docker system df --format '{{.Type}} {{.Size}}' | paste -sd, - | sed 's/,/, /g')"

echo "container check passed in $((SECONDS - started)) s"
