#!/usr/bin/env python3
"""Adversary 38, break: the scheduled auditor never audits a window while
the provider throttles its list pages, though the limit leaves room for
them. A window's walk takes a 429 as "no evidence": the window is not
audited and walked again from its first page at the next poll
(AUDITOR_POLL_MS), Retry-After ignored. With psp-sim's list class at 2/s
(burst 1) the first page takes the token, the next page gets the 429, and
the walk starts over 200 ms later: no window is ever audited, and the
auditor keeps sending ~5 requests/s at a 2/s limit. Issue 38: "A 429 is not
an outage ... it honours Retry-After when given, or backs off"."""
import time

import charged_e2e as e2e
from charged_e2e import check

AUDITOR = {"AUDITOR_WINDOW_MS": 2000, "AUDITOR_LAG_MS": 1500, "AUDITOR_POLL_MS": 200}
RUN_S = 12


def scenario(new):
    s = new("adv38_auditor429", partitions=4)
    t0 = int(float(s.query("SELECT extract(epoch FROM now())")[0][0])) - 2
    w = s.start_worker()
    s.wait_group_settled([w])
    s.publish([e2e.new_command(amount=100 + i) for i in range(40)])
    s.wait_settled(40, e2e.scaled(30))
    s.psp_put("/rate-limits", {"classes": {"list": {"rate": 2, "burst": 1},
                                           "retrieve": {"rate": 2, "burst": 1}},
                               "retry_after": True})
    s.start_auditor(AUDITOR_FROM=t0, **AUDITOR)
    deadline = time.monotonic() + RUN_S
    while time.monotonic() < deadline and s.audit_totals()["windows"] == 0:
        time.sleep(0.2)
    tot = s.audit_totals()
    throttled = s.psp_get("/rate-limits")["throttled"]
    e2e.log("audit totals", tot, "psp-sim throttled", throttled)
    check(tot["windows"] > 0,
          "no window audited in %d s of a 2/s list limit with Retry-After (%d list "
          "requests throttled): the auditor walks each window again from its first page "
          "every poll instead of waiting" % (RUN_S, throttled["list"]))


if __name__ == "__main__":
    raise SystemExit(e2e.main(scenario))
