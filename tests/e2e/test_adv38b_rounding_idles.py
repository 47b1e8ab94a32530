#!/usr/bin/env python3
"""Adversary 38b, break: the fleet's budget idles when the limit is smaller
than the members (and loses up to members - 1 requests/s at any limit).

Every member computes the whole fleet's allocation with itself LAST in the
demand array (budget_lease.c refresh_once) and keeps only its own row of
it. The rounding to whole requests/s gives the units left over to the
largest fractions, ties to the lowest index (budget_alloc.c quantize), and
split_leftover gives its remainder to the first members: in every member's
own view the odd unit goes to somebody else, so nobody takes it.

Three workers, a limit of 2 req/s (budget and psp-sim's limiter), 30
charges queued: every worker's target is 2/3 of a request, rounded to 0 by
each of them; psp-sim sees nothing and no charge is sent while the limit
stays 2 (issue 38: the fleet lives inside the budget, it does not idle
below it: requests >= 0.95x the binding limit)."""
import time

import charged_e2e as e2e
from charged_e2e import check

LIMIT = 2
WATCH_S = 8


def scenario(new):
    s = new("adv38b_rounding", partitions=6, psp_args=["--rate-limit", str(LIMIT)])
    s.set_limits("--global", str(LIMIT), actor="adv38b")
    ws = [s.start_worker() for _ in range(3)]
    s.wait_group_settled(ws)
    s.publish([e2e.new_command(amount=100 + i) for i in range(30)])
    t0 = time.time()
    time.sleep(WATCH_S)
    series = s.psp_get("/rate-limits")["per_second"]
    sent = sum(q["served"] + q["throttled"] for q in series if q["at"] >= int(t0) + 2)
    held = s.query("SELECT role, held_mrps[1], demand_mrps::text <> "
                   "array_fill(0::bigint, ARRAY[30])::text FROM provider_budget_members"
                   " WHERE expires_at > now()")
    done = int(s.query("SELECT count(*) FROM payment_attempts WHERE status = 'SUCCEEDED'")[0][0])
    e2e.log("psp-sim per second:", [(q["at"] - int(t0), q["served"], q["throttled"])
                                    for q in series],
            "members (role, held global mrps, has demand):", held, "succeeded:", done)
    whole = WATCH_S - 3  # the whole seconds from +2 s on, give or take one
    check(sent >= whole * LIMIT // 2,
          "with a limit of %d req/s, three workers and 30 charges queued, the provider saw "
          "%d requests in the %d s after +2 s (%d charges succeeded): every member "
          "rounded its 2/3 share down to 0, each believing the odd unit was another's"
          % (LIMIT, sent, WATCH_S - 2, done))


if __name__ == "__main__":
    raise SystemExit(e2e.main(scenario))
