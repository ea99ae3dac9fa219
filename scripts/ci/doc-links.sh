#!/usr/bin/env bash
# Checks every relative link of the documentation: each Markdown file git
# tracks, and the alert rules' runbook annotations. A link must name a file
# or folder that exists, and its #anchor a heading of that file (GitHub's
# slugs). Web addresses are not followed (no network here). Exits 1 listing
# every broken link.
set -euo pipefail
cd "$(dirname "$0")/../.."

git ls-files '*.md' 'deploy/prometheus/*.yml' | python3 -c '
import os, re, sys

def slugs(path, cache={}):
    if path not in cache:
        seen, out, fenced = {}, set(), False
        for line in open(path, encoding="utf-8"):
            if line.startswith("```"):
                fenced = not fenced
            if fenced or not line.startswith("#"):
                continue
            text = line.lstrip("#").strip().replace("`", "")
            slug = re.sub(r"[^\w\- ]", "", text.lower()).replace(" ", "-")
            n = seen.get(slug, 0)
            seen[slug] = n + 1
            out.add(slug if n == 0 else f"{slug}-{n}")
        cache[path] = out
    return cache[path]

def links(path):
    text = open(path, encoding="utf-8").read()
    if path.endswith(".yml"):
        for m in re.finditer(r"runbook:\s*\"([^\"]+)\"", text):
            yield m.group(1), "."
        return
    text = re.sub(r"(?ms)^```.*?^```", "", text)
    text = re.sub(r"`[^`\n]*`", "", text)
    for m in re.finditer(r"\]\(([^)\s]+)\)", text):
        yield m.group(1), os.path.dirname(path)

broken = []
for path in sys.stdin.read().split():
    for target, base in links(path):
        if re.match(r"[a-z]+:", target):
            continue
        file, _, anchor = target.partition("#")
        where = os.path.normpath(os.path.join(base, file)) if file else path
        if not os.path.exists(where):
            broken.append(f"{path}: {target} (no {where})")
        elif anchor and (not where.endswith(".md") or anchor not in slugs(where)):
            broken.append(f"{path}: {target} (no heading #{anchor} in {where})")
for line in broken:
    print(line)
if broken:
    sys.exit(f"{len(broken)} broken documentation links")
print("documentation links: all resolve")
'
