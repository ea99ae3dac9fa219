#!/usr/bin/env bash
# Lints the OpenAPI document that the service serves (GET /openapi.json)
# with the ecosystem's two linters, and fails on any error or warning:
#
#   - Redocly CLI, `redocly lint`, the recommended ruleset (redocly.yaml);
#   - Spectral, `spectral lint`, the spectral:oas ruleset (.spectral.yaml).
#
#   scripts/ci/openapi-lint.sh             build the service, start it on a fresh database,
#                                       fetch its document, stop it, drop the database
#   scripts/ci/openapi-lint.sh BASE_URL    lint the document of a running service
#
# The document is saved as $CARGO_TARGET_DIR/openapi.json for a look
# afterwards. Both linters are npm packages, installed (pinned, only when
# missing) into a folder outside the clone that is kept between runs:
# STAGEDOOR_OPENAPI_LINT_TOOLS (default /var/tmp/stagedoor-openapi-lint).
set -euo pipefail
cd "$(dirname "$0")/../.."
repo="$PWD"

export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-/var/tmp/stagedoor-target}"
tools="${STAGEDOOR_OPENAPI_LINT_TOOLS:-/var/tmp/stagedoor-openapi-lint}"
redocly_version="2.77.0"   # needs Node.js 20.19+ or 22.12+
spectral_version="6.16.3"
document="$CARGO_TARGET_DIR/openapi.json"

# Nothing leaves the machine: no usage reports, no update checks.
export REDOCLY_TELEMETRY=off REDOCLY_SUPPRESS_UPDATE_NOTICE=true SCARF_ANALYTICS=false
export NO_COLOR=1 FORCE_COLOR=0

# installed PACKAGE: the version of PACKAGE in $tools, or nothing.
installed() {
    local manifest="$tools/node_modules/$1/package.json"
    [ -r "$manifest" ] && node -p "require(process.argv[1]).version" "$manifest" 2>/dev/null || true
}

install_linters() {
    if [ "$(installed @redocly/cli)" = "$redocly_version" ] \
        && [ "$(installed @stoplight/spectral-cli)" = "$spectral_version" ] \
        && [ -x "$tools/node_modules/.bin/redocly" ] && [ -x "$tools/node_modules/.bin/spectral" ]; then
        return
    fi
    echo "installing @redocly/cli $redocly_version and @stoplight/spectral-cli $spectral_version into $tools" >&2
    mkdir -p "$tools"
    [ -f "$tools/package.json" ] || printf '{ "private": true }\n' >"$tools/package.json"
    (cd "$tools" && npm install --no-audit --no-fund --save-exact \
        "@redocly/cli@$redocly_version" "@stoplight/spectral-cli@$spectral_version" >&2)
}

# lint FILE: both linters, all of their output; fails if either finds anything.
lint() {
    local file=$1 failed=0 report errors warnings
    local redocly=("$tools/node_modules/.bin/redocly" lint --config "$repo/redocly.yaml")
    echo "==> redocly lint (recommended, redocly.yaml) $file"
    # The exit status of `redocly lint` counts errors only: the totals of its
    # JSON report decide, and the stylish report is what a person reads.
    "${redocly[@]}" --format stylish "$file" || true
    report="$("${redocly[@]}" --format json "$file" 2>/dev/null)" || true
    read -r errors warnings < <(node -e '
        const t = JSON.parse(process.argv[1]).totals;
        console.log(`${t.errors} ${t.warnings}`);' "$report" 2>/dev/null) ||
        { echo "redocly lint gave no report" >&2; return 1; }
    echo "redocly: $errors error(s), $warnings warning(s)"
    [ "$errors" -eq 0 ] && [ "$warnings" -eq 0 ] || failed=1

    echo "==> spectral lint (spectral:oas, .spectral.yaml) $file"
    # --fail-severity warn: a warning fails the run as an error does.
    if "$tools/node_modules/.bin/spectral" lint --ruleset "$repo/.spectral.yaml" \
        --fail-severity warn --format stylish "$file"; then
        echo "spectral: no errors, no warnings"
    else
        echo "spectral: the problems above"
        failed=1
    fi
    return "$failed"
}

# fetch BASE_URL: saves its /openapi.json as $document.
fetch() {
    mkdir -p "$(dirname "$document")"
    curl -fsS --max-time 10 -o "$document" "${1%/}/openapi.json"
    echo "saved ${1%/}/openapi.json as $document ($(wc -c <"$document") bytes)"
}

install_linters

if [ "$#" -eq 1 ]; then
    fetch "$1"
    lint "$document"
    exit
elif [ "$#" -ne 0 ]; then
    echo "usage: $0 [BASE_URL]" >&2
    exit 2
fi

# No arguments: a service of our own, on a database of our own, with the
# local configuration, as a newcomer's `cargo run` (the database created at
# start).
# shellcheck source=scripts/lib/throwaway-service.sh
. scripts/lib/throwaway-service.sh
cargo build --locked --bin stagedoor-checkout
throwaway_service stagedoor_lint_ "$CARGO_TARGET_DIR/debug/stagedoor-checkout"
fetch "$base"
stop_throwaway_service

lint "$document"
