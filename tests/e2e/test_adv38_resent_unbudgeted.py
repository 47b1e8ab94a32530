#!/usr/bin/env python3
"""Adversary 38, break: a request curl re-sends by itself is never asked of
the fleet's provider budget. When the provider closes a pooled connection
without answering (it executed, the answer was lost: psp-sim's
`drop_after`), libcurl sends the same request again on a fresh connection
(stripe_http.c counts it in `resent`); the gate gave one token, the
provider receives two requests.

One worker; the fleet's budget 10 requests/s; half of the requests psp-sim
executes lose their answer. psp-sim's limiter is off so that its 429s do
not slow the worker (with it on at 10/s the same run also gets 429s: 2 of
~75, over the 0.1% the budget promises, and 76 arrivals where 71 are
allowed). Counted from
psp-sim's per-second series (served + throttled: what arrived): over the
whole seconds of the run the arrivals must stay within 10/s and one per
member of the budget."""
import time

import charged_e2e as e2e
from charged_e2e import check

LIMIT = 10
RUN_S = 8


def scenario(new):
    s = new("adv38_resent", partitions=4,
            psp_args=["--fault", "drop_after=0.5"])
    s.set_limits("--global", str(LIMIT), actor="adv38")
    w = s.start_worker()
    s.wait_group_settled([w])
    s.publish([e2e.new_command(amount=100 + i) for i in range(300)])
    time.sleep(RUN_S)
    series = s.psp_get("/rate-limits")["per_second"]
    e2e.log("psp-sim per second (at, served, throttled):",
            [(q["at"] - series[0]["at"], q["served"], q["throttled"]) for q in series])
    full = series[1:-1]  # whole seconds only
    check(full, "no whole second in psp-sim's series")
    arrived = sum(q["served"] + q["throttled"] for q in full)
    members = max(1, len(s.query("SELECT 1 FROM provider_budget_members")))
    check(arrived <= LIMIT * len(full) + members,
          "%d requests reached psp-sim in %d whole seconds under a fleet budget of %d/s "
          "(%d member): requests curl re-sent after a lost answer are outside the budget"
          % (arrived, len(full), LIMIT, members))


if __name__ == "__main__":
    raise SystemExit(e2e.main(scenario))
