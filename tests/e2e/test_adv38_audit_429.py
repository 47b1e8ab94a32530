#!/usr/bin/env python3
"""Adversary 38, break: `chargectl audit run` gives up at the first 429.
Issue 38: "A 429 is not an outage ... it honours Retry-After when given, or
backs off". The auditor's walk takes a throttled list page as "no evidence"
and the whole window as not audited: the operator's audit exits 1 after one
429, though psp-sim said when to come back (Retry-After, 1 s).

Sixty charges settle; psp-sim then limits list and retrieve to 1/s (burst 1)
with Retry-After; nothing else calls it. An audit that honours Retry-After
finishes in a few seconds with no finding."""
import time

import charged_e2e as e2e
from charged_e2e import check

N = 60


def scenario(new):
    s = new("adv38_audit429", partitions=4)
    w = s.start_worker()
    s.wait_group_settled([w])
    s.publish([e2e.new_command(amount=100 + i) for i in range(N)])
    s.wait_settled(N, e2e.scaled(30))
    s.psp_put("/rate-limits", {"classes": {"list": {"rate": 1, "burst": 1},
                                           "retrieve": {"rate": 1, "burst": 1}},
                               "retry_after": True})
    started = time.time()
    since = int(time.time() - s.created_at) + 2
    rc, out, err = s.audit("run", "--since", "%ds" % since, "--json")
    throttled = s.psp_get("/rate-limits")["throttled"]
    e2e.log("audit exit", rc, "in %.1f s" % (time.time() - started), "psp-sim throttled",
            throttled, err.strip()[-300:])
    check(rc == 0,
          "chargectl audit run exited %d after %d request(s) throttled (Retry-After given): "
          "%s" % (rc, sum(throttled.values()), err.strip()[-300:]))


if __name__ == "__main__":
    raise SystemExit(e2e.main(scenario))
