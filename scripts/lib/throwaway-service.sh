# Sourced by the scripts that check a real service from outside
# (schemathesis.sh, openapi-lint.sh, metrics-check.sh): one way to run
# `stagedoor-checkout serve` on a database of its own and a free port, and to
# leave nothing behind however the script ends.
#
#   throwaway_service PREFIX BIN [NAME=VALUE ...]
#       starts BIN serve with the local configuration on the database
#       PREFIX<pid> (created at start, dropped on exit), with the extra
#       environment given, and waits until GET /readyz answers. Sets $base,
#       $pid, $log and $db. Databases of earlier runs with the same prefix
#       whose process is gone are dropped first.
#   stop_throwaway_service
#       SIGTERM, then fails unless the service exits 0 within 45 s.
#   throwaway_files+=(FILE ...)
#       more files for the exit trap to remove.

throwaway_files=()
pid=""

throwaway_cleanup() {
    local status=$?
    if [ -n "$pid" ] && kill -0 "$pid" 2>/dev/null; then
        kill -TERM "$pid" 2>/dev/null || true
        wait "$pid" 2>/dev/null || true
    fi
    if [ "$status" -ne 0 ] && [ -s "${log:-}" ]; then
        echo "--- the service's log (last 40 lines)"
        tail -n 40 "$log"
    fi
    if [ -n "${db:-}" ]; then
        psql -h 127.0.0.1 -U postgres -qc "DROP DATABASE IF EXISTS \"$db\" WITH (FORCE)" >/dev/null 2>&1 || true
    fi
    rm -f "${log:-}" "${throwaway_files[@]}"
}

throwaway_service() {
    local prefix="$1" bin="$2"
    shift 2
    db="${prefix}$$"
    log="$(mktemp)"
    trap throwaway_cleanup EXIT
    trap 'exit 130' INT TERM
    psql -h 127.0.0.1 -U postgres -Atc "SELECT datname FROM pg_database WHERE datname LIKE '${prefix}%'" \
        | while read -r old; do
            kill -0 "${old#"$prefix"}" 2>/dev/null \
                || psql -h 127.0.0.1 -U postgres -qc "DROP DATABASE IF EXISTS \"$old\" WITH (FORCE)"
        done
    local port
    port="$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')"
    base="http://127.0.0.1:$port"
    env DATABASE_URL="postgres://postgres@127.0.0.1:5432/$db" \
        STAGEDOOR__SERVER__PORT="$port" \
        RUST_LOG="${RUST_LOG:-warn}" \
        "$@" "$bin" serve >"$log" 2>&1 &
    pid=$!
    local ready_by=$((SECONDS + 60))
    until curl -fsS -o /dev/null --max-time 2 "$base/readyz" 2>/dev/null; do
        kill -0 "$pid" 2>/dev/null || { echo "the service exited before it was ready" >&2; exit 1; }
        [ "$SECONDS" -lt "$ready_by" ] || { echo "the service was not ready on $base after 60 s" >&2; exit 1; }
        sleep 0.5
    done
}

stop_throwaway_service() {
    kill -TERM "$pid"
    for _ in $(seq 1 45); do kill -0 "$pid" 2>/dev/null || break; sleep 1; done
    if kill -0 "$pid" 2>/dev/null; then
        echo "the service was still running 45 s after SIGTERM" >&2
        exit 1
    fi
    local status=0
    wait "$pid" || status=$?
    pid=""
    if [ "$status" -ne 0 ]; then
        echo "the service exited with status $status after SIGTERM (expected 0)" >&2
        exit 1
    fi
}
