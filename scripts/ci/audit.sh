#!/usr/bin/env bash
# Dependency checks, offline but for fetching the locked crates:
#   - cargo audit: known vulnerabilities (RustSec) in Cargo.lock and in the fuzz
#     crate's lockfile, against the advisory database snapshot vendored next to
#     the clone (../shared/advisory-db; STAGEDOOR_ADVISORY_DB overrides);
#   - cargo deny: licenses, bans and sources, as deny.toml says. Its advisories
#     check would fetch a database from the network: cargo audit does that part.
# Installs both tools (pinned, --locked) when missing, as debug builds: on a
# new machine they build in 5 minutes instead of 13, and still check the
# lockfiles in seconds. Exits non-zero on any finding that deny.toml or
# .cargo/audit.toml does not allow with a reason.
set -euo pipefail
cd "$(dirname "$0")/../.."

audit_version="0.22.2"
deny_version="0.20.2"
db="${STAGEDOOR_ADVISORY_DB:-../shared/advisory-db}"

# The tools' builds share one folder: cargo-deny reuses most of what
# cargo-audit compiled (from nothing: 1:12 instead of 2:09), and so does
# cargo-fuzz (scripts/ci/fuzz.sh).
export CARGO_TARGET_DIR="${STAGEDOOR_TOOLS_TARGET:-/var/tmp/stagedoor-tools-target}"
if [ "$(cargo audit --version 2>/dev/null)" != "cargo-audit-audit $audit_version" ]; then
    echo "installing cargo-audit $audit_version" >&2
    # Without its default binary-scanning (`cargo audit bin`), unused here.
    cargo install --debug --locked --quiet --no-default-features cargo-audit --version "$audit_version"
fi
if [ "$(cargo deny --version 2>/dev/null)" != "cargo-deny $deny_version" ]; then
    echo "installing cargo-deny $deny_version" >&2
    cargo install --debug --locked --quiet cargo-deny --version "$deny_version"
fi

if [ ! -d "$db/crates" ]; then
    echo "no RustSec advisory database at $db (set STAGEDOOR_ADVISORY_DB)" >&2
    exit 1
fi
echo "advisory database: $(head -c 120 "$db/SNAPSHOT" 2>/dev/null || echo "$db")"

# Both tools read every locked crate, for every platform, from cargo's local
# registry: a build fetches only this platform's, so fetch the rest (from the
# registry, the one network this needs) before the offline checks.
cargo fetch --locked --quiet
if [ -f fuzz/Cargo.lock ]; then
    cargo fetch --locked --quiet --manifest-path fuzz/Cargo.toml
fi

echo "--- cargo audit: Cargo.lock"
cargo audit --db "$db" --no-fetch --deny warnings
if [ -f fuzz/Cargo.lock ]; then
    echo "--- cargo audit: fuzz/Cargo.lock"
    cargo audit --db "$db" --no-fetch --deny warnings --file fuzz/Cargo.lock
fi

echo "--- cargo deny: bans, licenses, sources"
cargo deny --frozen check --hide-inclusion-graph bans licenses sources
