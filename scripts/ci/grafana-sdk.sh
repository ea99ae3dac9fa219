#!/usr/bin/env bash
# Installs the Grafana Foundation SDK (PyPI, pinned) into a virtualenv of its
# own when it is missing, and prints that virtualenv's python on stdout:
#   python="$(scripts/ci/grafana-sdk.sh)"
#   "$python" deploy/grafana/dashboard.py --check
# The version is pinned so that the generated dashboard does not change under
# the committed JSON with a new release; a new pin means regenerating it.
set -euo pipefail

version='1769699998!10.1.0'
venv=/var/tmp/stagedoor-grafana-sdk
python="$venv/bin/python"

installed="$("$python" -c 'from importlib.metadata import version; print(version("grafana-foundation-sdk"))' 2>/dev/null || true)"
if [ "$installed" != "$version" ]; then
    echo "installing grafana-foundation-sdk $version into $venv" >&2
    rm -rf "$venv"
    if ! python3 -m venv "$venv" >&2; then
        # Debian's python3 makes virtualenvs only with python3-venv; an
        # install from empty package lists finds nothing: refresh them only then.
        export DEBIAN_FRONTEND=noninteractive
        if ! apt-get -o DPkg::Lock::Timeout=600 install -y -qq --no-install-recommends python3-venv >/dev/null 2>&1; then
            apt-get -o DPkg::Lock::Timeout=600 update -qq >&2
            apt-get -o DPkg::Lock::Timeout=600 install -y -qq --no-install-recommends python3-venv >&2
        fi
        rm -rf "$venv"
        python3 -m venv "$venv" >&2
    fi
    "$python" -m pip install -q --disable-pip-version-check "grafana-foundation-sdk==$version" >&2
fi
echo "$python"
