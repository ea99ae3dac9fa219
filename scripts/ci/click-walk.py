#!/usr/bin/env python3
"""docs/DESIGN.md's walk of one click, checked against the code.

Each step of the walk is a numbered line of the form

    N. `path` `function` (lines A–B): what it does

and names a file of the repository, a function defined in it (a Rust `fn`
or an SQL `FUNCTION`), and the lines that function spans, from its
definition's first line to its closing line. This fails when a file or a
function is gone, when a range is not the function's own, or when the walk
names more than MAX_FILES files, so that the walk cannot rot:

    scripts/ci/click-walk.py           rewrite each range from the code
    scripts/ci/click-walk.py --check   exit 1 on any difference (CI)

Python 3.11's standard library only.
"""
import os
import re
import sys

ROOT = os.path.normpath(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))
DESIGN = os.path.join(ROOT, "docs", "DESIGN.md")
MAX_FILES = 8

# A step may wrap: its path, its function and its range may be on lines of
# their own.
STEP = re.compile(r"^(\d+\.\s+`([^`]+)`\s+`([^`]+)`\s+\(lines )(\d+)–(\d+)\)", re.M)
RUST_FN = r"^(\s*)(?:pub(?:\([a-z]+\))? )?(?:async )?fn {name}\b"
SQL_FN = r"^CREATE (?:OR REPLACE )?FUNCTION {name}\("


def span(path, name):
    """The lines (1-based, inclusive) of `name`'s definition in `path`, or
    an error message."""
    full = os.path.join(ROOT, path)
    if not os.path.isfile(full):
        return None, f"{path}: no such file"
    with open(full, encoding="utf-8") as f:
        lines = f.read().split("\n")
    sql = path.endswith(".sql")
    pattern = re.compile((SQL_FN if sql else RUST_FN).format(name=re.escape(name)))
    starts = [i for i, line in enumerate(lines) if pattern.match(line)]
    if len(starts) != 1:
        found = "not defined" if not starts else f"defined {len(starts)} times"
        return None, f"{path}: `{name}` is {found}"
    start = starts[0]
    if sql:
        ends = (i for i in range(start, len(lines)) if lines[i].strip() == "$$;")
    else:
        indent = pattern.match(lines[start]).group(1)
        ends = (i for i in range(start, len(lines)) if lines[i] == indent + "}")
    end = next(ends, None)
    if end is None:
        return None, f"{path}: `{name}` has no end"
    return (start + 1, end + 1), None


def main():
    check = "--check" in sys.argv[1:]
    with open(DESIGN, encoding="utf-8") as f:
        text = f.read()
    errors, files, steps = [], set(), 0

    def step(match):
        nonlocal steps
        steps += 1
        head, path, name, a, b = match.groups()
        files.add(path)
        lines, error = span(path, name)
        if error:
            errors.append(error)
            return match.group(0)
        if (int(a), int(b)) != lines:
            if check:
                errors.append(
                    f"{path} `{name}`: lines {a}–{b} in the walk, "
                    f"{lines[0]}–{lines[1]} in the code"
                )
        return f"{head}{lines[0]}–{lines[1]})"

    out = STEP.sub(step, text)
    if steps == 0:
        errors.append("docs/DESIGN.md has no walk (numbered steps `path` `function` (lines A–B))")
    if len(files) > MAX_FILES:
        errors.append(f"the walk names {len(files)} files, more than {MAX_FILES}: {sorted(files)}")
    if not check and not errors:
        with open(DESIGN, "w", encoding="utf-8") as f:
            f.write(out)
    for error in errors:
        print(f"click walk: {error}", file=sys.stderr)
    if errors:
        if check:
            print("click walk: scripts/ci/click-walk.py rewrites the ranges from the code", file=sys.stderr)
        return 1
    print(f"click walk: {steps} steps in {len(files)} files, each range its function's")
    return 0


if __name__ == "__main__":
    sys.exit(main())
