#!/usr/bin/env python3
"""No code outside an operation's folder names an operation (issue 37).

An operation is a folder under worker/operations/ and one line of the
table (worker/operations/operations.c); the roles, chargectl and the
shared code reach it through the face (op.h), never by name
(docs/architecture.md, "Adding an operation"). This test reads the code
charged is built from (common/ and worker/, C, headers, the console's
page and the build files), outside worker/operations/<kind>/, without
its comments (a comment may say "a capture's" as an example; it does
not depend on one), and fails on a line that names an operation of the
table, unless:

- the name is a shared one: the provider's words and the contract's
  fields and statuses (SHARED_WORDS: capture_method, AUTHORIZED, ...);
- or the file is one of the shared names' (SHARED_FILES: the operations
  table itself, the attempt statuses, the metric names, the finding
  kinds, the provider client).

Every per-kind piece is behind the face now: the reviews' shared steps,
chargectl's refusals, the unmatched event's reason and the console's page
(which draws the per-kind parts the console serves from the table).

The operations checked are those of the table, by their names' stems
(authorize: "authoriz", capture: "captur", void: "void", not the C
keyword), but the charge and the refund, which the roles named before
the face existed and still do (OLD_KINDS).

Usage: test_operation_names.py [SOURCE_DIR]  (default $CHARGED_SOURCE_DIR,
else the repository this file is in). Exit 0 clean, 1 a name found.
"""
import os
import re
import subprocess
import sys

# The roles' names of these are older than the face, and still to move.
OLD_KINDS = {"charge", "refund"}

# Words that name what the provider or the contract calls it, not an
# operation of ours (compared whole, case-insensitive).
SHARED_WORDS = {
    # The provider's (Stripe's) manual capture: the intent's fields and
    # statuses, and the provider client's names for them.
    "capture_method", "requires_capture", "amount_capturable", "capturable",
    "amount_to_capture", "provider_capture_manual", "provider_capture_automatic",
    "provider_authorized",
    # The contract's fields and an attempt's statuses (attempt_status.h).
    "captured_amount", "authorized", "voided", "attempt_status_authorized",
    "attempt_status_voided",
    # Kafka's ACL denials (librdkafka's error codes), not an operation.
    "rd_kafka_resp_err_group_authorization_failed",
    "rd_kafka_resp_err_topic_authorization_failed",
    "rd_kafka_resp_err_cluster_authorization_failed",
}
# HTTP's header, not an operation.
HEADER = re.compile(r"\bAuthorization: Bearer")

# Files that hold shared names, whole.
SHARED_FILES = {
    "worker/operations/operations.c": "the operations table",
    "common/core/attempt_status.c": "attempt statuses",
    "common/core/attempt_status.h": "attempt statuses",
    "common/runtime/metrics.c": "metric names",
    "common/runtime/metrics.h": "metric names",
    "common/core/audit_policy.c": "finding kinds (stored, metric labels)",
    "common/core/audit_policy.h": "finding kinds (stored, metric labels)",
    "common/provider/": "the provider's API: its capture and cancel calls",
    "common/core/provider_outcome.c": "the provider's answers (requires_capture)",
    "common/core/provider_outcome.h": "the provider's answers (requires_capture)",
    "common/budget/": "the provider's endpoint classes and the budget's "
                      "priorities (contract, \"Provider budget\")",
    "worker/chargectl/ctl_provider.c": "the budget's endpoint classes",
    "worker/roles/console_limits.c": "the budget's endpoint classes",
}

WORD = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
QUOTED_VOID = re.compile(r"""['"]void\b""")
CODE = re.compile(r"\.(c|h|js|html|css|txt)$|(^|/)CMakeLists\.txt$")


def stems(source):
    """The stems of the table's operations but OLD_KINDS, from its lines."""
    table = open(os.path.join(source, "worker/operations/operations.c")).read()
    names = re.findall(r"^\s*X\((\w+)_payment_op\)", table, re.M)
    if not names:
        sys.exit("test_operation_names: no operations in the table")
    # authorize -> authoriz (authorization), capture -> captur (captured).
    return [n[:-1] if n.endswith("e") else n for n in names if n not in OLD_KINDS]


def without_comments(text, path):
    """The text with /* */ and // comments blanked, lines kept."""
    if not path.endswith((".c", ".h", ".js")):
        return re.sub(r"#.*", "", text)
    out, i, n = [], 0, len(text)
    quote = None
    while i < n:
        c = text[i]
        if quote:
            out.append(c)
            if c == "\\" and i + 1 < n:
                out.append(text[i + 1])
                i += 2
                continue
            if c == quote:
                quote = None
        elif c in "\"'`":
            quote = c
            out.append(c)
        elif text.startswith("/*", i):
            end = text.find("*/", i + 2)
            end = n if end < 0 else end + 2
            out.append(re.sub(r"[^\n]", " ", text[i:end]))
            i = end
            continue
        elif text.startswith("//", i) and not (path.endswith(".js") and text[i - 1:i] == ":"):
            end = text.find("\n", i)
            end = n if end < 0 else end
            i = end
            continue
        else:
            out.append(c)
        i += 1
    return "".join(out)


def names_a_kind(line, kinds):
    """The words of line that name one of kinds (stems)."""
    found = []
    line = HEADER.sub("", line)
    for m in WORD.finditer(line):
        word = m.group(0)
        if word.lower() in SHARED_WORDS:
            continue
        for part in word.lower().split("_"):
            if part in SHARED_WORDS:
                continue
            if any(part.startswith(k) if k != "void" else
                   part in ("void", "voids") and word != "void" for k in kinds):
                found.append(word)
                break
    if "void" in kinds and QUOTED_VOID.search(line):
        found.append('"void"')
    return found


def shared(path):
    return any(path == f or (f.endswith("/") and path.startswith(f)) for f in SHARED_FILES)


def files(source):
    try:
        out = subprocess.run(["git", "-C", source, "ls-files", "common", "worker"],
                             capture_output=True, text=True, check=True).stdout.split()
    except (OSError, subprocess.CalledProcessError):
        out = [os.path.relpath(os.path.join(d, f), source)
               for top in ("common", "worker")
               for d, _, fs in os.walk(os.path.join(source, top)) for f in fs]
    return sorted(p for p in out if CODE.search(p)
                  and not re.match(r"worker/operations/[^/]+/", p) and not shared(p))


def main():
    here = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    source = sys.argv[1] if len(sys.argv) > 1 else os.environ.get("CHARGED_SOURCE_DIR", here)
    kinds = stems(source)
    bad = []
    for path in files(source):
        try:
            text = open(os.path.join(source, path), encoding="utf-8").read()
        except (OSError, UnicodeDecodeError):
            continue
        lines = [(i, names_a_kind(l, kinds))
                 for i, l in enumerate(without_comments(text, path).splitlines(), 1)]
        lines = [(i, w) for i, w in lines if w]
        if lines:
            bad.append((path, lines))
    for path, lines in bad:
        print("%s names an operation on %d lines: it should reach the "
              "operation through the face (op.h)" % (path, len(lines)))
        for i, words in lines:
            print("  %s:%d: %s" % (path, i, ", ".join(sorted(set(words)))))
    if bad:
        print("%d files outside worker/operations/<kind>/ name an operation (%s)"
              % (len(bad), ", ".join(kinds)))
        return 1
    print("no file outside worker/operations/<kind>/ names %s" % ", ".join(kinds))
    return 0


if __name__ == "__main__":
    sys.exit(main())
