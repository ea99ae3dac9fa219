#!/usr/bin/env bash
# Fuzzes the idempotency key parser and the request hash with cargo fuzz
# (libFuzzer), each target for SECONDS (default 30):
#
#   scripts/ci/fuzz.sh [SECONDS]
#
# The targets are in fuzz/fuzz_targets/ (a crate and workspace of its own).
# cargo fuzz needs nightly-only compiler flags (-Zsanitizer, sancov); the
# stable toolchain takes them with RUSTC_BOOTSTRAP=1. Builds go to
# /var/tmp/stagedoor-fuzz-target and the corpus grows in
# /var/tmp/stagedoor-fuzz-corpus (FUZZ_TARGET_DIR / FUZZ_CORPUS_DIR), both
# outside the clone so later runs reuse them. A crash stops the run with its
# input saved under fuzz/artifacts/ and the command that replays it.
set -euo pipefail
cd "$(dirname "$0")/../.."

seconds="${1:-30}"
fuzz_version="0.13.2"
target_dir="${FUZZ_TARGET_DIR:-/var/tmp/stagedoor-fuzz-target}"
corpus_dir="${FUZZ_CORPUS_DIR:-/var/tmp/stagedoor-fuzz-corpus}"
targets=(idempotency_key request_hash)

if [ "$(cargo fuzz --version 2>/dev/null)" != "cargo-fuzz $fuzz_version" ]; then
    # A debug build: it only drives cargo, and builds in a fraction of the time.
    echo "installing cargo-fuzz $fuzz_version" >&2
    # In the folder the audit tools were built in (scripts/ci/audit.sh).
    CARGO_TARGET_DIR="${STAGEDOOR_TOOLS_TARGET:-/var/tmp/stagedoor-tools-target}" \
        cargo install --debug --locked --quiet cargo-fuzz --version "$fuzz_version"
fi
export RUSTC_BOOTSTRAP=1
unset CARGO_TARGET_DIR # the main build's folder: other flags, it would rebuild both ways
unset RUSTC_WORKSPACE_WRAPPER # CI's lint of the main workspace (scripts/ci/rustc-lint)

cargo fuzz build --target-dir "$target_dir"
log="$(mktemp)"
trap 'rm -f "$log"' EXIT
for target in "${targets[@]}"; do
    echo "--- $target: ${seconds}s"
    mkdir -p "$corpus_dir/$target"
    status=0
    cargo fuzz run --target-dir "$target_dir" "$target" "$corpus_dir/$target" -- \
        -max_total_time="$seconds" -print_final_stats=1 >"$log" 2>&1 || status=$?
    if [ "$status" -ne 0 ]; then
        tail -n 80 "$log"
        echo "$target: the fuzzer failed (status $status); the input is under fuzz/artifacts/$target/" >&2
        exit "$status"
    fi
    # The summary: coverage and corpus at start and end, runs, execs/s.
    grep -E '(INITED|DONE) +cov|^Done [0-9]+ runs|^stat::(number_of_executed_units|average_exec_per_sec|new_units_added|peak_rss_mb)' "$log" || true
done
