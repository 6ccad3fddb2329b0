#!/usr/bin/env python3
"""Checks the tree against the layering and naming rules of CONTRIBUTING.md.

The rules are read from the two tables between the `layout-rules` markers in
CONTRIBUTING.md, so the written rules and this check cannot drift apart:

  includes  a file in folder F may include (with #include "...", or
            <osftrt/...>) headers of F itself and of the folders listed for
            F; every folder under src/ must have a row.
  names     the base name of every file in a listed folder matches one of
            the folder's patterns; no two files under include/ and src/
            share a base name.

Usage: check_layout.py REPO_ROOT    (exit 0: clean; 1: violations listed)
       check_layout.py --self-test  (the check catches each kind of violation)
"""
import os
import re
import shutil
import sys
import tempfile

SOURCE_EXT = (".h", ".c", ".cpp", ".cu", ".cuh", ".in")
# Headers configured at build time, and the folder their template lives in.
GENERATED = {"osftrt_build_config.h": "src/core"}
INCLUDE_RE = re.compile(r'^\s*#\s*include\s*([<"])([^>"]+)[>"]')


def table(text, name):
    """Rows (first cell, second cell) of the table between the markers."""
    begin = "<!-- layout-rules:%s:begin -->" % name
    end = "<!-- layout-rules:%s:end -->" % name
    if begin not in text or end not in text:
        sys.exit("check_layout: CONTRIBUTING.md lacks the %r table markers" % name)
    body = text[text.index(begin) + len(begin):text.index(end)]
    rows = []
    for line in body.splitlines():
        line = line.strip()
        if not line.startswith("|") or set(line) <= set("|- "):
            continue
        # Split on | outside backticks (patterns contain |).
        cells, cell, in_code = [], "", False
        for ch in line.strip("|"):
            if ch == "`":
                in_code = not in_code
            if ch == "|" and not in_code:
                cells.append(cell.strip())
                cell = ""
            else:
                cell += ch
        cells.append(cell.strip())
        rows.append(cells)
    return rows[1:]  # the header row


def source_files(root, folder):
    top = os.path.join(root, folder)
    for d, _, files in os.walk(top):
        for f in sorted(files):
            if f.endswith(SOURCE_EXT):
                yield os.path.relpath(os.path.join(d, f), root)


def folder_of(path, folders):
    """The most specific rule folder containing `path`, or None."""
    best = None
    for f in folders:
        if path == f or path.startswith(f + "/"):
            if best is None or len(f) > len(best):
                best = f
    return best


def resolve(root, including, target, angle):
    """Repository path of an included project header, or None (external)."""
    if angle:
        return os.path.join("include", target) if target.startswith("osftrt/") else None
    if target in GENERATED:
        return os.path.join(GENERATED[target], target)
    here = os.path.dirname(including)
    for base in (here, "include", "src"):
        candidate = os.path.normpath(os.path.join(base, target))
        if os.path.isfile(os.path.join(root, candidate)):
            return candidate
    return "?" + target


def check_includes(root, rules, errors):
    folders = list(rules)
    for sub in sorted(os.listdir(os.path.join(root, "src"))):
        if os.path.isdir(os.path.join(root, "src", sub)) and "src/" + sub not in rules:
            errors.append("src/%s: no include rule in CONTRIBUTING.md" % sub)
    checked = 0
    for folder in folders:
        if not os.path.isdir(os.path.join(root, folder)):
            continue
        for path in source_files(root, folder):
            if folder_of(path, folders) != folder:
                continue  # a more specific row covers it
            with open(os.path.join(root, path), encoding="utf-8", errors="replace") as fh:
                for lineno, line in enumerate(fh, 1):
                    m = INCLUDE_RE.match(line)
                    if not m:
                        continue
                    checked += 1
                    target = resolve(root, path, m.group(2), m.group(1) == "<")
                    if target is None:
                        continue
                    if target.startswith("?"):
                        errors.append("%s:%d: #include \"%s\" is not a file of the project"
                                      % (path, lineno, target[1:]))
                        continue
                    owner = folder_of(target, folders)
                    if owner == folder or owner in rules[folder]:
                        continue
                    errors.append("%s:%d: %s may not include %s (%s); allowed: %s"
                                  % (path, lineno, folder, target, owner or "no rule",
                                     ", ".join(sorted(rules[folder])) or "nothing else"))
    return checked


def check_names(root, patterns, errors):
    for folder, pats in patterns.items():
        regexes = [re.compile(p + r"\Z") for p in pats]
        for path in source_files(root, folder):
            base = os.path.basename(path)
            if not any(r.match(base) for r in regexes):
                errors.append("%s: name does not match %s's patterns (%s)"
                              % (path, folder, ", ".join(pats)))
    seen = {}
    for folder in ("include", "src"):
        for path in source_files(root, folder):
            seen.setdefault(os.path.basename(path), []).append(path)
    for base, paths in sorted(seen.items()):
        if len(paths) > 1:
            errors.append("%s: base name shared by %s" % (base, ", ".join(paths)))
    return len(seen)


def self_test(rules_file):
    """Seeds a copy of the rules with one violation of each kind."""
    cases = {
        "upward include": ("src/cpu/x_cpu.cpp", '#include "ops/flce_ops.h"\n',
                           "src/cpu may not include src/ops/flce_ops.h"),
        "capi include": ("src/ops/y_compute.cpp", '#include "capi/capi_util.h"\n',
                         "src/ops may not include src/capi/capi_util.h"),
        "bad name": ("src/cpu/flce.cpp", "", "name does not match src/cpu"),
        "shared name": ("src/core/flce.h", "", "base name shared by"),
        "missing file": ("src/core/z.cpp", '#include "core/nope.h"\n', "is not a file"),
        "no rule": ("src/newlayer/a.cpp", "", "src/newlayer: no include rule"),
    }
    skeleton = {"include/osftrt/flce.h": "", "src/ops/flce_ops.h": "",
                "src/capi/capi_util.h": "", "src/core/ok.h": ""}
    failed = 0
    for name, (path, body, expect) in cases.items():
        tmp = tempfile.mkdtemp()
        try:
            shutil.copy(rules_file, os.path.join(tmp, "CONTRIBUTING.md"))
            for p, b in list(skeleton.items()) + [(path, body)]:
                os.makedirs(os.path.join(tmp, os.path.dirname(p)), exist_ok=True)
                with open(os.path.join(tmp, p), "w") as fh:
                    fh.write(b)
            errors = []
            rules, patterns = load_rules(tmp)
            check_includes(tmp, rules, errors)
            check_names(tmp, patterns, errors)
            hit = any(expect in e for e in errors)
            print("layout self-test %-15s %s" % (name, "caught" if hit else "MISSED"))
            failed += not hit
        finally:
            shutil.rmtree(tmp)
    return 1 if failed else 0


def load_rules(root):
    with open(os.path.join(root, "CONTRIBUTING.md"), encoding="utf-8") as fh:
        text = fh.read()
    rules = {}
    for cells in table(text, "includes"):
        allowed = cells[1] if len(cells) > 1 else ""
        rules[cells[0]] = {a.strip() for a in allowed.split(",") if a.strip()}
    patterns = {}
    for cells in table(text, "names"):
        patterns[cells[0]] = re.findall(r"`([^`]+)`", cells[1])
    return rules, patterns


def main():
    if len(sys.argv) > 1 and sys.argv[1] == "--self-test":
        here = os.path.dirname(os.path.abspath(__file__))
        return self_test(os.path.join(here, "..", "..", "CONTRIBUTING.md"))
    root = sys.argv[1] if len(sys.argv) > 1 else "."
    rules, patterns = load_rules(root)
    errors = []
    n_includes = check_includes(root, rules, errors)
    n_files = check_names(root, patterns, errors)
    for e in errors:
        print("layout: " + e)
    print("layout: %d include lines in %d rule folders, %d file names under include/ and src/: %s"
          % (n_includes, len(rules), n_files,
             "%d violation(s)" % len(errors) if errors else "clean"))
    return 1 if errors else 0


if __name__ == "__main__":
    sys.exit(main())
