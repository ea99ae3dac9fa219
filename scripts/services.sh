#!/usr/bin/env bash
# Starts the local services the tests need (PostgreSQL, Redis) when they are
# down, and waits until they answer. Safe to run when they are already up.
set -euo pipefail

if ! pg_isready -h 127.0.0.1 -p 5432 -q; then
    echo "starting PostgreSQL"
    pg_ctlcluster --skip-systemctl-redirect "$(ls /etc/postgresql | head -n1)" main start
fi
for _ in $(seq 1 30); do
    pg_isready -h 127.0.0.1 -p 5432 -q && break
    sleep 1
done
pg_isready -h 127.0.0.1 -p 5432

if command -v redis-server >/dev/null && ! redis-cli -h 127.0.0.1 -p 6379 ping >/dev/null 2>&1; then
    echo "starting Redis"
    redis-server --daemonize yes --bind 127.0.0.1 -::1 --port 6379 --save "" --appendonly no \
        --dir /var/lib/redis --logfile /var/log/redis/ci.log
fi
