#!/usr/bin/env bash
# Installs promtool (Debian's `prometheus` package) when it is missing, and
# prints its path on stdout, so that a caller can do:
#   promtool="$(scripts/ci/prometheus-tools.sh)"
# Quiet when promtool is already there. The package also brings the
# Prometheus server; nothing here starts it.
set -euo pipefail

if ! command -v promtool >/dev/null; then
    echo "installing promtool (Debian's prometheus package)" >&2
    export DEBIAN_FRONTEND=noninteractive
    # An install from empty package lists finds nothing: refresh them only then.
    if ! apt-get -o DPkg::Lock::Timeout=600 install -y -qq --no-install-recommends prometheus >/dev/null 2>&1; then
        apt-get -o DPkg::Lock::Timeout=600 update -qq >&2
        apt-get -o DPkg::Lock::Timeout=600 install -y -qq --no-install-recommends prometheus >&2
    fi
fi

command -v promtool
