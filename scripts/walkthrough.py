#!/usr/bin/env python3
"""Runs the README's curl walkthrough as printed and checks what it shows.

    scripts/walkthrough.py [--runs N]     (default 2)

Takes the first ```sh block under "## A checkout with curl" in README.md
(not a copy of it), runs it whole in one bash, N times in a row against
whatever serves http://127.0.0.1:8080 (`cargo run --release`), and
compares, step by step (`# 1.`, `# 2.` ...), each line the README shows as
output that is a status line (`# HTTP/1.1 201 Created`) or a header line
(`# idempotent-replayed: true`) with what that step printed: the status
line exactly, a header by its name (any case) and its value, where `…`
stands for anything that follows. A note after two spaces and a `(` is
the README's comment, not output. Bodies are not compared (ids differ).

Prints each check; on the first difference, the step's output, and exits 1.
"""
import re
import subprocess
import sys
from pathlib import Path

README = Path(__file__).resolve().parent.parent / "README.md"
MARK = "@@walkthrough-step"
STEP = re.compile(r"^# (\d+)\. ")
STATUS = re.compile(r"^# (HTTP/\S+ \d{3}\b.*?)(?:\s{2,}\(.*)?$")
HEADER = re.compile(r"^# ([a-z][a-z0-9-]*): (.+?)(?:\s{2,}\(.*)?$")


def block():
    text = README.read_text()
    start = text.index("## A checkout with curl")
    fence = text.index("```sh\n", start) + len("```sh\n")
    return text[fence:text.index("```", fence)]


def steps(code):
    """[(number, the step's lines)] in order; the lines before the first
    step belong to none."""
    found = []
    for line in code.splitlines():
        step = STEP.match(line)
        if step:
            found.append((step.group(1), []))
        if found:
            found[-1][1].append(line)
    return found


def expected(lines):
    """What the step shows as output: ("status", line) and ("header", name,
    value) in order."""
    shown = []
    for line in lines:
        if status := STATUS.match(line):
            shown.append(("status", status.group(1).strip()))
        elif header := HEADER.match(line):
            shown.append(("header", header.group(1), header.group(2).strip()))
    return shown


def script(found):
    parts = []
    for number, lines in found:
        parts.append(f"printf '\\n{MARK} {number}\\n'")
        parts.extend(lines)
    return "\n".join(parts) + "\n"


def outputs(printed):
    """The step number -> the lines it printed (carriage returns dropped)."""
    by_step, current = {}, None
    for line in printed.replace("\r", "").splitlines():
        if line.startswith(MARK + " "):
            current = line.split()[1]
            by_step[current] = []
        elif current is not None:
            by_step[current].append(line)
    return by_step


def matches(want, line):
    if want[0] == "status":
        return line.strip() == want[1]
    name, value = want[1], want[2]
    if ":" not in line:
        return False
    got_name, got_value = line.split(":", 1)
    if got_name.strip().lower() != name:
        return False
    got_value = got_value.strip()
    if "…" in value:
        return got_value.startswith(value.split("…")[0])
    return got_value == value


def main():
    runs = int(sys.argv[sys.argv.index("--runs") + 1]) if "--runs" in sys.argv else 2
    found = steps(block())
    if not found:
        sys.exit("no numbered steps in README.md's curl block")
    code = script(found)
    checks = sum(len(expected(lines)) for _, lines in found)
    for run in range(1, runs + 1):
        try:
            done = subprocess.run(
                ["bash", "-c", code],
                capture_output=True,
                text=True,
                timeout=300,
            )
        except subprocess.TimeoutExpired:
            sys.exit(f"run {run}: the block did not finish in 300 s")
        printed = outputs(done.stdout + done.stderr)
        for number, lines in found:
            got = printed.get(number)
            if got is None:
                print(done.stdout + done.stderr, file=sys.stderr)
                sys.exit(f"run {run}, step {number}: never reached")
            for want in expected(lines):
                shown = want[1] if want[0] == "status" else f"{want[1]}: {want[2]}"
                if not any(matches(want, line) for line in got):
                    print("\n".join(got), file=sys.stderr)
                    sys.exit(f"run {run}, step {number}: expected `{shown}`, not in the output above")
                print(f"ok    run {run}, step {number}: {shown}")
    print(f"the README's walkthrough: {len(found)} steps, {checks} lines checked, {runs} runs")


if __name__ == "__main__":
    main()
