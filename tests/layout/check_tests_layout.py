#!/usr/bin/env python3
"""The layout rules of tests/c (tests/c/README.md), checked from the sources:

  - the CMocka context fixture lives only in tests/c/test_fixture.c: no other
    file defines a setup/teardown that creates or destroys a context;
  - every test program in tests/c (a file with main) is registered in
    tests/CMakeLists.txt, and a capability test (test_<cap>_*.c for flinear,
    mlp, comm, projection, qr, flce) has its CUDA twin (<name>_cuda, CUDA,
    the same sources);
  - no function in tests/c is longer than 100 lines.

Usage: check_tests_layout.py REPO_ROOT   (exit 0: the rules hold)
"""
import glob, os, re, sys

os.chdir(sys.argv[1] if len(sys.argv) > 1 else '.')

bad = []
cmake = open('tests/CMakeLists.txt').read()
calls = re.findall(r'osftrt_c_test\(([^)]*)\)', cmake)
regs = {}
for c in calls:
    words = c.split()
    name = words[0]
    srcs = words[words.index('SOURCES') + 1:] if 'SOURCES' in words else []
    regs[name] = ('CUDA' in words, sorted(srcs))

twinned = ('flinear', 'mlp', 'comm', 'projection', 'qr', 'flce')
for path in sorted(glob.glob('tests/c/*.c')):
    base = os.path.basename(path)
    src = open(path).read()
    # 1. the context fixture is not copied
    if base != 'test_fixture.c':
        for m in re.finditer(r'^static int (\w*(?:setup|teardown)\w*)\(void \*\*state\) \{(.*?)^\}',
                             src, re.M | re.S):
            if re.search(r'tt_context\(|osft_context_(create|destroy)\(', m.group(2)):
                bad.append(f'{path}: {m.group(1)}() copies the context fixture; '
                           'use tt_setup/tt_teardown (tests/c/test_fixture.h)')
    # 2. registered, with its CUDA twin
    if re.search(r'^int main\(', src, re.M):
        users = [n for n, (_, s) in regs.items() if f'c/{base}' in s]
        if not users:
            bad.append(f'{path}: not registered in tests/CMakeLists.txt')
        cap = base[len('test_'):-2].split('_')[0]
        if cap in twinned:
            for n in users:
                cuda, s = regs[n]
                if cuda:
                    continue
                twin = regs.get(n + '_cuda')
                if twin is None or not twin[0] or twin[1] != s:
                    bad.append(f'{path}: {n} has no CUDA twin {n}_cuda with the same sources')
    # 3. functions of at most 100 lines
    lines = src.split('\n')
    depth, start, name = 0, None, None
    for i, ln in enumerate(lines):
        code = re.sub(r'"(\\.|[^"\\])*"|\'(\\.|[^\'\\])\'|//.*', '', ln)
        if depth == 0:
            m = re.match(r'^[A-Za-z_][\w \*]*?\b(\w+)\(', code)
            if m and not code.startswith(('typedef', 'enum', 'struct', '#')):
                start, name = i, m.group(1)
        depth += code.count('{') - code.count('}')
        if depth == 0 and start is not None and '}' in code:
            if i - start + 1 > 100:
                bad.append(f'{path}:{start + 1}: {name}() has {i - start + 1} lines (at most 100)')
            start = None
if bad:
    print('\n'.join(bad), file=sys.stderr)
    sys.exit(1)
print(f'tests layout: the rules hold ({len(regs)} registered tests)')
