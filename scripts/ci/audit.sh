#!/usr/bin/env bash
# Dependency checks with cargo deny, offline but for fetching the locked crates:
#   - advisories: known vulnerabilities, unsound and unmaintained crates
#     (RustSec) in Cargo.lock and in the fuzz crate's lockfile, against the
#     advisory database snapshot vendored next to the clone
#     (../shared/advisory-db; STAGEDOOR_ADVISORY_DB overrides);
#   - licenses, bans and sources, as deny.toml says.
# Installs cargo-deny (pinned, --locked) when missing, as a debug build: on a
# new machine it builds in a fraction of a release build's time, and still
# checks the lockfiles in seconds. Exits non-zero on any finding that
# deny.toml does not allow with a reason.
set -euo pipefail
cd "$(dirname "$0")/../.."

deny_version="0.20.2"
db="${STAGEDOOR_ADVISORY_DB:-../shared/advisory-db}"

# The tools' builds share one folder: cargo-fuzz reuses much of what
# cargo-deny compiled (scripts/ci/fuzz.sh).
export CARGO_TARGET_DIR="${STAGEDOOR_TOOLS_TARGET:-/var/tmp/stagedoor-tools-target}"
if [ "$(cargo deny --version 2>/dev/null)" != "cargo-deny $deny_version" ]; then
    echo "installing cargo-deny $deny_version" >&2
    cargo install --debug --locked --quiet cargo-deny --version "$deny_version"
fi

if [ ! -d "$db/crates" ]; then
    echo "no RustSec advisory database at $db (set STAGEDOOR_ADVISORY_DB)" >&2
    exit 1
fi
echo "advisory database: $(head -c 120 "$db/SNAPSHOT" 2>/dev/null || echo "$db")"

# cargo deny reads an advisory database only as a git clone, kept in its
# db-path in a folder named for the database's address (RustSec's is
# advisory-db-3157b0e258782691), and with --offline never fetches it. The
# snapshot is plain files: this run's clone of it is made here, and the
# config is deny.toml with db-path pointing at it.
dbs="$(mktemp -d)"
trap 'rm -rf "$dbs"' EXIT
clone="$dbs/advisory-db-3157b0e258782691"
cp -r "$db" "$clone"
git -C "$clone" init -q
git -C "$clone" add -A
git -C "$clone" -c user.name=stagedoor-ci -c user.email=ci@stagedoor.invalid \
    commit -q -m "RustSec advisory database snapshot"
config="$dbs/deny.toml"
{ cat deny.toml; printf '\n[advisories]\ndb-path = "%s"\n' "$dbs"; } >"$config"

# cargo deny reads every locked crate, for every platform, from cargo's local
# registry: a build fetches only this platform's, so fetch the rest (from the
# registry, the one network this needs) before the offline checks.
cargo fetch --locked --quiet
if [ -f fuzz/Cargo.lock ]; then
    cargo fetch --locked --quiet --manifest-path fuzz/Cargo.toml
fi

echo "--- cargo deny: advisories, bans, licenses, sources (Cargo.lock)"
cargo deny --offline --config "$config" check --hide-inclusion-graph advisories bans licenses sources
if [ -f fuzz/Cargo.lock ]; then
    echo "--- cargo deny: advisories (fuzz/Cargo.lock)"
    cargo deny --offline --config "$config" --manifest-path fuzz/Cargo.toml \
        check --hide-inclusion-graph advisories
fi
