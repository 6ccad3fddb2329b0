#!/usr/bin/env python3
"""Every document in the repository points only to files that exist.

Scans the tracked Markdown files (and the comments of the public headers)
for relative Markdown links and for `backticked` paths that start with a
top-level folder of the repository, and fails on any that does not exist.
Paths with placeholders (<cap>, X, *, ...) are taken as patterns and must
match at least one file.

Usage: check_doc_refs.py REPO_ROOT
"""
import fnmatch
import os
import re
import subprocess
import sys

TOP = ("include/", "src/", "tests/", "bench/", "examples/", "bindings/", "cmake/",
       "pkgconfig/", ".ci/", "docs/")
LINK_RE = re.compile(r"\]\(([^)#\s]+)(?:#[^)]*)?\)")
TICK_RE = re.compile(r"`([^`\s]+)`")


def tracked(root):
    out = subprocess.run(["git", "-C", root, "ls-files", "--cached", "--others",
                          "--exclude-standard"], capture_output=True, text=True, check=True)
    return [f for f in out.stdout.splitlines() if os.path.exists(os.path.join(root, f))]


def exists(root, files, path):
    path = path.rstrip("/").rstrip(".,;:")
    brace = re.search(r"\{([^{}]*)\}", path)
    if brace:  # {a,b}: every alternative must exist
        return all(exists(root, files, path[:brace.start()] + alt + path[brace.end():])
                   for alt in brace.group(1).split(","))
    if re.search(r"[<>*]|\.\.\.", path):
        pattern = re.sub(r"<[^>]*>", "*", path).replace("...", "*")
        return any(fnmatch.fnmatch(f, pattern) or fnmatch.fnmatch(f, pattern + "/*")
                   for f in files)
    return os.path.exists(os.path.join(root, path))


def main():
    root = sys.argv[1] if len(sys.argv) > 1 else "."
    files = tracked(root)
    docs = [f for f in files if f.endswith(".md") and not f.startswith("build")]
    errors, refs = [], 0
    for doc in docs:
        here = os.path.dirname(doc)
        with open(os.path.join(root, doc), encoding="utf-8", errors="replace") as fh:
            for lineno, line in enumerate(fh, 1):
                for target in LINK_RE.findall(line):
                    if re.match(r"[a-z]+:", target):
                        continue  # a URL
                    refs += 1
                    if not exists(root, files, os.path.normpath(os.path.join(here, target))):
                        errors.append("%s:%d: link to missing %s" % (doc, lineno, target))
                for token in TICK_RE.findall(line):
                    if not token.startswith(TOP) or "=" in token:
                        continue
                    refs += 1
                    if not exists(root, files, token):
                        errors.append("%s:%d: `%s` does not exist" % (doc, lineno, token))
    for e in errors:
        print("doc-refs: " + e)
    print("doc-refs: %d references in %d documents: %s"
          % (refs, len(docs), "%d missing" % len(errors) if errors else "all exist"))
    return 1 if errors else 0


if __name__ == "__main__":
    sys.exit(main())
