#!/usr/bin/env bash
# Installs the OpenID provider the identity-provider tests run against
# (npm `oidc-provider`, pinned, only when missing) into a folder outside the
# clone that is kept between runs, STAGEDOOR_OIDC_PROVIDER_TOOLS (default
# /var/tmp/stagedoor-oidc-provider), and prints the path of its module for
# tests/oidc/provider.mjs (OIDC_PROVIDER_MODULE). Node.js and npm are
# installed from Debian when missing. The tests (tests/api/provider.rs)
# call it themselves.
set -euo pipefail

tools="${STAGEDOOR_OIDC_PROVIDER_TOOLS:-/var/tmp/stagedoor-oidc-provider}"
version="9.13.3"
module="$tools/node_modules/oidc-provider/lib/index.js"

# One install at a time: the tests call this in parallel.
mkdir -p "$(dirname "$tools")"
exec 9>"$tools.lock"
flock 9

if ! command -v node >/dev/null || ! command -v npm >/dev/null; then
    echo "installing nodejs and npm" >&2
    apt-get -o DPkg::Lock::Timeout=600 install -y nodejs npm >&2
fi

installed() {
    local manifest="$tools/node_modules/oidc-provider/package.json"
    [ -r "$manifest" ] && node -p "require(process.argv[1]).version" "$manifest" 2>/dev/null || true
}

if [ "$(installed)" != "$version" ] || [ ! -r "$module" ]; then
    echo "installing oidc-provider $version into $tools" >&2
    mkdir -p "$tools"
    [ -f "$tools/package.json" ] || printf '{ "private": true }\n' >"$tools/package.json"
    (cd "$tools" && npm install --no-audit --no-fund --save-exact "oidc-provider@$version" >&2)
fi
echo "$module"
