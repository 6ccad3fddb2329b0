"""Runs the README's Python example as written: the first ```python block of
the "## Python" section, then checks that it trained and stayed orthogonal."""
import os
import re
import sys

root = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
text = open(os.path.join(root, "README.md")).read()
section = text[text.index("## Python\n"):]
code = re.search(r"```python\n(.*?)```", section, re.S).group(1)
print(code)
scope = {}
exec(compile(code, "README.md (Python example)", "exec"), scope)
loss, patched = scope["loss"].item(), scope["patched"]
orth = max(patched.projector.orthogonality())
print("README example: final loss %.4f, orthogonality %.1e" % (loss, orth))
sys.exit(0 if loss < 6.0 and orth <= 1e-5 else 1)
