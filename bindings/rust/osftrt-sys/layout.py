#!/usr/bin/env python3
"""Breaks bindgen's unformatted output into indented lines, deterministically.

generate.sh runs bindgen with --no-rustfmt-bindings (a rustfmt of another
version could change the bytes, and the drift test compares bytes); this
puts one statement or item per line so that a drift shows as a readable
diff. Not a Rust formatter: it only inserts line breaks and indentation
after `;`, `{` and `}` (and before `}`) outside string and char literals.
Usage: layout.py < in.rs > out.rs
"""
import sys


def main():
    src = sys.stdin.read()
    out, line, depth, i, n = [], [], 0, 0, len(src)

    def flush():
        text = "".join(line).strip()
        if text:
            out.append("    " * depth + text)
        line.clear()

    while i < n:
        c = src[i]
        if c == '"':  # copy a string literal whole
            j = i + 1
            while j < n and src[j] != '"':
                j += 2 if src[j] == "\\" else 1
            line.append(src[i:j + 1])
            i = j + 1
            continue
        if c == "\n":
            flush()
        elif c == ";":
            line.append(c)
            flush()
        elif c == "{":
            line.append(c)
            flush()
            depth += 1
        elif c == "}":
            flush()
            depth = max(depth - 1, 0)
            line.append(c)
            # `} ,` and `} ;` stay on the closing line.
            k = i + 1
            while k < n and src[k] == " ":
                k += 1
            if k < n and src[k] in ",;)":
                i = k
                continue
            flush()
        else:
            line.append(c)
        i += 1
    flush()
    sys.stdout.write("\n".join(out) + "\n")


if __name__ == "__main__":
    main()
