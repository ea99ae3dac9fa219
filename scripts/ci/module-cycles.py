#!/usr/bin/env python3
"""Fails if two modules of the service import each other, directly or
around a circle: a module that depends on one that depends back on it can
be neither read nor changed on its own.

    scripts/ci/module-cycles.py [-v] [SRC]     (SRC: src/ by default)

For each file it reads the `crate::`, `super::` and `self::` paths it uses
(in `use` trees and inline), resolves each to the file that defines the
item (following `pub use` re-exports), and looks for strongly connected
components of that graph twice: between files, and between the top modules
of the crate (`http`, `observe`, `payrail`...). Any component of more than
one is printed with its edges. -v also prints every file's edges.

A parent naming its own children (`mod x; x::f()`) is the module tree, not a
dependency, and is not counted."""
import os
import re
import sys

verbose = "-v" in sys.argv[1:]
roots = [arg for arg in sys.argv[1:] if arg != "-v"]
root = os.path.normpath(roots[0] if roots else os.path.join(os.path.dirname(__file__), "..", "..", "src"))

# Module path (a tuple) -> file. The crate roots only declare modules.
files = {}
for directory, _, names in os.walk(root):
    for name in names:
        if not name.endswith(".rs"):
            continue
        path = os.path.join(directory, name)
        module = os.path.relpath(path, root)[:-3].split(os.sep)
        if module in (["lib"], ["main"]) or module[0] == "bin":
            continue
        if module[-1] == "mod":
            module = module[:-1]
        files[tuple(module)] = path


def code_of(text):
    """The text with comments, strings and chars blanked, offsets kept."""
    out, i, n = [], 0, len(text)

    def blank(j):
        out.append(re.sub(r"[^\n]", " ", text[i:j]))
        return j

    while i < n:
        raw = re.match(r'r(#*)"', text[i:])
        char = re.match(r"'(\\.|[^\\'])'", text[i:])
        if text.startswith("//", i):
            j = text.find("\n", i)
            i = blank(n if j < 0 else j)
        elif text.startswith("/*", i):
            j = text.find("*/", i + 2)
            i = blank(n if j < 0 else j + 2)
        elif raw:
            end = '"' + raw.group(1)
            j = text.find(end, i + len(raw.group(0)))
            i = blank(n if j < 0 else j + len(end))
        elif text[i] == '"':
            j = i + 1
            while j < n and text[j] != '"':
                j += 2 if text[j] == "\\" else 1
            i = blank(j + 1)
        elif char:
            i = blank(i + len(char.group(0)))
        else:
            out.append(text[i])
            i += 1
    return "".join(out)


def use_paths(tree):
    """`a::{b, c::{d, e as f}}` -> [[a, b], [a, c, d], [a, c, e]]."""
    tree = re.sub(r"\s+", " ", tree).strip()
    braces = re.match(r"^(.*?)\{(.*)\}$", tree)
    if not braces:
        path = re.sub(r"\s+as\s+\w+$", "", tree).replace(" ", "")
        return [[s for s in path.split("::") if s and s != "*"]]
    prefix, inner = braces.groups()
    parts, depth, part = [], 0, ""
    for ch in inner:
        if ch == "," and depth == 0:
            parts.append(part)
            part = ""
            continue
        depth += {"{": 1, "}": -1}.get(ch, 0)
        part += ch
    parts.append(part)
    return [path for part in parts if part.strip() for path in use_paths(prefix + part)]


code = {module: code_of(open(path).read()) for module, path in files.items()}

# Module -> {name: the path a `pub use` gives it, relative to the module}.
reexports = {module: {} for module in files}
for module, text in code.items():
    for m in re.finditer(r"\bpub(?:\([^)]*\))?\s+use\s+([^;]+);", text):
        for path in use_paths(m.group(1)):
            if path:
                reexports[module][path[-1]] = path


def resolve(module, path, hops=0):
    """The file module that defines `path`, as written in `module`."""
    if path[0] == "crate":
        at, rest = (), path[1:]
    elif path[0] in ("super", "self"):
        at, rest = module, list(path)
        while rest and rest[0] in ("super", "self"):
            if rest.pop(0) == "super":
                at = at[:-1]
    elif hops and module + (path[0],) in files:
        at, rest = module, path  # a re-export of a child's item
    else:
        return None
    for segment in rest:
        if at + (segment,) in files:
            at += (segment,)
            continue
        target = reexports.get(at, {}).get(segment)
        if target and hops < 10:
            return resolve(at, target, hops + 1) or at
        return at
    return at


def inline_modules(text):
    """(start, end, name) of each `mod name { ... }` of a file."""
    spans = []
    for m in re.finditer(r"\bmod\s+(\w+)\s*\{", text):
        depth, j = 1, m.end()
        while j < len(text) and depth:
            depth += {"{": 1, "}": -1}.get(text[j], 0)
            j += 1
        spans.append((m.start(), j, m.group(1)))
    return spans


edges = {module: set() for module in files}
for module, text in code.items():
    spans = inline_modules(text)

    def add(at, path):
        # `super::` in a file's `mod tests { }` is that file.
        where = module + tuple(name for start, end, name in spans if start <= at < end)
        target = resolve(where, path) if path else None
        while target and target not in files:
            target = target[:-1]
        if target and target != module:
            edges[module].add(target)

    for m in re.finditer(r"(?<![\w:])(?:crate|super|self)(?:::\w+)+", text):
        add(m.start(), m.group(0).split("::"))
    for m in re.finditer(r"\buse\s+((?:crate|super|self)\b[^;]*);", text):
        for path in use_paths(m.group(1)):
            add(m.start(), path)

tops = {}
for module, targets in edges.items():
    for target in targets:
        if target[0] != module[0]:
            tops.setdefault(module[0], set()).add(target[0])
            tops.setdefault(target[0], set())


def components(graph):
    """Tarjan's strongly connected components of more than one node."""
    index, low, stack, on_stack, found = {}, {}, [], set(), []

    def visit(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in graph.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.remove(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    sys.setrecursionlimit(10_000)
    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def name(node):
    return node if isinstance(node, str) else "::".join(node)


if verbose:
    for module in sorted(edges):
        print(f"{files[module]}: {', '.join(sorted(map(name, edges[module]))) or '-'}")
cycles = 0
for level, graph in (("top modules", tops), ("files", edges)):
    for component in components(graph):
        cycles += 1
        print(f"a cycle between {level}: {' <-> '.join(map(name, component))}")
        for a in component:
            for b in sorted(graph[a] & set(component)):
                print(f"    {name(a)} uses {name(b)}")
if cycles == 0:
    print(f"no module cycles in {root} ({len(files)} files)")
sys.exit(1 if cycles else 0)
