#!/usr/bin/env python3
"""No `assert` statement in the end-to-end scenarios, their harness or the
deployment checks (tests/deploy): python -O removes them, and a check that
can vanish is no check. They use charged_e2e.check / check_eq, which raise
Failure. Needs no servers."""
import ast
import glob
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))


def bare_asserts(source, filename):
    """(line, text) of every assert statement in source."""
    lines = source.splitlines()
    return [(n.lineno, lines[n.lineno - 1].strip())
            for n in ast.walk(ast.parse(source, filename)) if isinstance(n, ast.Assert)]


def main():
    # The detector itself must see an assert, or the scan below proves nothing.
    planted = bare_asserts("def f(x):\n    if x:\n        assert x, 'm'\n", "<planted>")
    if [l for l, _ in planted] != [3]:
        print("the detector missed a planted assert: %s" % planted)
        print("0 passed, 1 failed")
        return 1
    # The deployment checks (tests/deploy) use the same check functions.
    files = sorted(glob.glob(os.path.join(HERE, "*.py")) +
                   glob.glob(os.path.join(HERE, "..", "deploy", "*.py")))
    found = []
    for path in files:
        with open(path, encoding="utf-8") as f:
            source = f.read()
        found += ["%s:%d: %s" % (os.path.basename(path), line, text)
                  for line, text in bare_asserts(source, path)]
    if len(files) < 2 or os.path.basename(__file__) not in map(os.path.basename, files):
        print("scanned %d files in %s: not the scenarios" % (len(files), HERE))
        print("0 passed, 1 failed")
        return 1
    if found:
        print("bare assert statements (python -O drops them; use charged_e2e.check):")
        for f in found:
            print("  " + f)
        print("0 passed, 1 failed")
        return 1
    print("scanned %d files, no assert statement" % len(files))
    print("1 passed, 0 failed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
