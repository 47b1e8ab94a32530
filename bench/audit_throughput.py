#!/usr/bin/env python3
"""Intents audited per second, against a baseline run in the same
invocation: N intents in psp-sim, each matching a SUCCEEDED attempt and its
ledger row, all in one window. The baseline walks psp-sim's list alone
(every page of 100, read and parsed in Python: what the provider costs);
then `chargectl audit run` audits the same window (the list walk, the copy
of each page, the match against the ledger, the ledger side). The ratio
says what the audit adds to reading the provider's books; the peak RSS of
chargectl shows that a window is streamed, not held.

Needs the test stack, as bench/worker_throughput.py does.

  python3 bench/audit_throughput.py [N]
"""
import json
import os
import resource
import sys
import time
import urllib.request

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "tests", "e2e"))
import charged_e2e as e2e  # noqa: E402
import test_auditor  # noqa: E402


def walk_list(s, gte, lt):
    """Every page of psp-sim's intents in [gte, lt): how many."""
    n, after = 0, ""
    while True:
        url = ("http://127.0.0.1:%d/v1/payment_intents?created[gte]=%d&created[lt]=%d"
               "&limit=100%s" % (s.psp_port, gte, lt,
                                 "&starting_after=" + after if after else ""))
        req = urllib.request.Request(url, headers={"Authorization": "Bearer " + e2e.API_KEY})
        with urllib.request.urlopen(req, timeout=60) as r:
            page = json.load(r)
        n += len(page["data"])
        if not page["has_more"]:
            return n
        after = page["data"][-1]["id"]


def main(new):
    n = int(sys.argv[1]) if len(sys.argv) > 1 else 100000
    s = new("bench_audit")
    at = int(float(s.query("SELECT extract(epoch FROM now())")[0][0])) - 5
    test_auditor.bulk_setup(s, n, at)

    t0 = time.monotonic()
    listed = walk_list(s, at, at + 1)
    base = time.monotonic() - t0
    e2e.check_eq(listed, n, "intents listed")

    t0 = time.monotonic()
    rc, out, err = s.audit("run", "--since", "60s", "--json")
    audit = time.monotonic() - t0
    e2e.check(rc == 0, "audit run: %d %s" % (rc, err))
    v = json.loads(out)
    e2e.check_eq((v["intents_seen"], v["ledger_rows_seen"]), (n, n), "audited")
    rss = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
    print("intents: %d in one window, each with its attempt and ledger row" % n)
    print("baseline, the list walk alone:  %.1f s, %.0f intents/s" % (base, n / base))
    print("chargectl audit run:            %.1f s, %.0f intents/s" % (audit, n / audit))
    print("ratio audit/baseline time: %.2f" % (audit / base))
    print("peak RSS of the largest child (chargectl audit run, psql, ...): %.1f MiB"
          % (rss / 1024.0))


if __name__ == "__main__":
    sys.exit(e2e.main(main))
