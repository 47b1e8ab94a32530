#!/usr/bin/env python3
"""The demo ends with one aligned report: every line tools/demo_report.py
writes through say() puts its text at one column, whatever its label, and
tools/demo.sh prints nothing of its own after the report began (no raw
psql table, no raw JSON). Standard library only; no stack."""
import contextlib
import io
import os
import re
import sys

ROOT = os.environ.get("CHARGED_SOURCE_DIR") or os.path.join(os.path.dirname(
    os.path.abspath(__file__)), "..", "..")
sys.path.insert(0, os.path.join(ROOT, "tools"))
import demo_report  # noqa: E402

failed = 0


def check(ok, what):
    global failed
    print("%s  %s" % ("ok  " if ok else "FAIL", what))
    failed += not ok


# Every module of the report writes its lines through demo_common.say().
source = "".join(open(os.path.join(ROOT, "tools", f)).read()
                 for f in ("demo_report.py", "demo_authorize.py"))
labels = sorted(set(re.findall(r'say\("([^"]+)"', source)))
check(len(labels) >= 15, "labels of the report: %d" % len(labels))
out = io.StringIO()
with contextlib.redirect_stdout(out):
    for label in labels:
        demo_report.say(label, "TEXT")
columns = {line.index("TEXT") for line in out.getvalue().splitlines()}
check(len(columns) == 1, "the text of every line starts at one column: %s" % sorted(columns))
check(all(re.fullmatch(r"[^ ]+(?: [^ ]+)*: +TEXT", l) for l in out.getvalue().splitlines()),
      "every line is 'label: text'")
check(not re.search(r"print\(\"(?!demo:)[a-z ,]+: ", source),
      "no report line printed around say()")

demo = open(os.path.join(ROOT, "tools", "demo.sh")).read()
after = demo[demo.index("tools/demo_report.py"):]
prints = [l for l in after.splitlines()
          if re.match(r"\s*(psql|python3 -c|echo|curl)\b", l) and "logs in" not in l]
check(not prints, "demo.sh prints nothing beside the report: %s" % prints)
print("%d failed" % failed)
sys.exit(1 if failed else 0)
