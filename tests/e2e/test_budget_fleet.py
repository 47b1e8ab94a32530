#!/usr/bin/env python3
"""The fleet's provider budget on the real stack (issue 38): psp-sim limits
the account (global 40/s, create 30/s), `chargectl provider limits set`
gives the fleet the same limits, two workers and a reconciler draw from
them, and N charges flow.

Asserted: every charge executed once (psp-sim's ledger against the
attempts); psp-sim's 429s at most 0.1% of what it served (its limiter is
Stripe's kind, a bucket of the limit's size); psp-sim's served requests in
any second of its series above the limit in force by at most what the
members' buckets hold (a fifth of the limit, one request a member at
least); and when `chargectl provider limits set` lowers the
create limit at run time, the same holds for the new limit from 2 s after
the change on (the members follow at their next refresh, ~250 ms, and the
lease bounds one that does not), and none over the seconds after the change
taken together. Meanwhile a charge the budget holds back reads so:
`chargectl attempt show` prints its waiting_reason `provider_budget`.

Why one per member at least: a gate sends at most its share and its
bucket in any second of its own clock; psp-sim counts a request in the
second it arrives. A request the
scheduler or the wire held back lands in the next second beside that
second's own (seen under ASan with the other sets running: 16 in a second
at a limit of 15, none throttled).

A process killed holding a share costs the fleet at most one lease: once
the fleet is steady under the lowered limit, one worker is SIGKILLed; its
share (about half) is held by its row until its lease ends (1 s) and the
survivor takes it at its next refresh (250 ms): psp-sim's first whole
second after that serves near the whole limit again, well above the
survivor's half. (The dead worker's commands come back to the survivor at
the rebalance; its claims' leases are 3 s here so that they wait no
longer.)"""
import re
import time

import charged_e2e as e2e
from charged_e2e import check, check_eq

N = 220
GLOBAL, CREATE = 40, 30
LOWER = 15  # create, at run time
BURST_MS = 200  # common/budget/budget_gate.h
FOLLOW_S = 2
# The dead member's share is free after its lease (BUDGET_LEASE_MS) and
# taken at the survivor's next refresh (BUDGET_REFRESH_MS, 200-300 ms).
LEASE_AND_REFRESH_S = 1.0 + 0.3
STEADY_S = 2.5  # after the change, before the kill
TAKEN = LOWER - 4  # served in a second by the survivor with the whole share
MEMBERS = 3  # two workers and a reconciler: the arrival slack, one each
# The dead worker's claims come back to the survivor 3 s after its last
# renewal (the lease must outlast a call's timeout and its retries).
SHORT_LEASES = {"WORKER_LEASE_MS": 3000, "PROVIDER_TIMEOUT_MS": 1000,
                "WORKER_UNKNOWN_RETRIES": 1}


def slack(limit):
    """What a second may carry over a limit: the members' buckets
    (BUDGET_GATE_BURST_MS, 200 ms, of each share; one request at least)."""
    return limit * BURST_MS // 1000 + MEMBERS


def settled(s):
    return int(s.query("SELECT count(*) FROM payment_attempts WHERE status NOT IN "
                       "('PENDING', 'PROCESSING')")[0][0])


def budget_queued(s):
    """A charge the budget holds back a second or more reads so in chargectl
    attempt show (docs/states.md, "Waiting"), while it waits."""
    for (attempt_id,) in s.query(
            "SELECT id FROM payment_attempts WHERE waiting_reason = 'provider_budget'"
            " AND lease_expires_at > now() LIMIT 3"):
        text = s.run([e2e.CHARGECTL, "attempt", "show", attempt_id]).stdout.decode()
        if re.search(r"^waiting_reason +provider_budget$", text, re.M):
            return attempt_id
    return None


def scenario(new):
    s = new("budget_fleet", partitions=4,
            psp_args=["--rate-limit", str(GLOBAL), "--rate-limit-class",
                      "create=%d" % CREATE])
    s.set_limits("--global", str(GLOBAL), "--class", "create=%d" % CREATE)
    workers = [s.start_worker(**SHORT_LEASES), s.start_worker(**SHORT_LEASES)]
    s.start_reconciler()
    s.wait_group_settled(workers)
    s.publish([e2e.new_command(amount=100 + i) for i in range(N)])
    e2e.wait_until("a third of the charges settled", lambda: settled(s) >= N // 3,
                   e2e.scaled(30), 0.1)
    changed_at = time.time()
    s.set_limits("--class", "create=%d" % LOWER)
    steady = time.time() + STEADY_S
    e2e.wait_until("a charge shown waiting for the budget", lambda: budget_queued(s),
                   STEADY_S, 0.1)
    time.sleep(max(0.0, steady - time.time()))
    check(settled(s) < N * 2 // 3, "the survivor would have too little work left")
    killed_at = time.time()
    s.kill_worker(workers[0])
    s.wait_settled(N, e2e.scaled(60))
    s.check_invariants()
    check_eq(len([c for c in s.ledger() if not c.get("injected")]), N,
             "charges psp-sim executed")

    rl = s.psp_get("/rate-limits")
    series = rl["per_second"]
    served = sum(p["served"] for p in series)
    throttled = sum(p["throttled"] for p in series)
    e2e.log("psp-sim per second (at, served, throttled):",
            [(p["at"] - series[0]["at"], p["served"], p["throttled"]) for p in series],
            "limit lowered at +%.1f s" % (changed_at - series[0]["at"]))
    check(served >= N, "psp-sim served %d requests, fewer than the %d charges"
          % (served, N))
    check(throttled * 1000 <= served,
          "%d of %d requests throttled: more than 0.1%%" % (throttled, served))
    for p in series:
        limit = CREATE if p["at"] < changed_at + FOLLOW_S else LOWER
        check(p["served"] <= limit + slack(limit),
              "second %d: %d requests served, over the limit in force %d and the "
              "members' buckets (%d) (lowered to %d at %.1f)"
              % (p["at"], p["served"], limit, slack(limit), LOWER, changed_at))
    after = [p for p in series if p["at"] >= changed_at + FOLLOW_S]
    check(after, "no second of the series after the change: the run ended too soon")
    # The wire moves a request, it does not add one: over the seconds after
    # the change together, the one-per-member slack is not multiplied.
    span = after[-1]["at"] - after[0]["at"] + 1
    check(sum(p["served"] for p in after) <= LOWER * span + slack(LOWER),
          "%d requests served in the %d s after the change: over %d/s and the members' "
          "buckets" % (sum(p["served"] for p in after), span, LOWER))
    taken = [p for p in series if p["at"] >= killed_at + LEASE_AND_REFRESH_S]
    e2e.log("killed at +%.1f s; the first whole second after its lease and a refresh:"
            % (killed_at - series[0]["at"]), taken[:1])
    check(taken and taken[0]["served"] >= TAKEN,
          "the first second %.1f s after a worker was killed served %s, under %d: the "
          "survivor did not take the dead worker's share within its lease and a refresh"
          % (LEASE_AND_REFRESH_S, taken[0]["served"] if taken else None, TAKEN))
    check_eq(s.exited_workers(), [], "workers that exited")
    shares = s.query("SELECT role, count(*) FROM provider_budget_members GROUP BY 1 "
                     "ORDER BY 1")
    e2e.log("budget members at the end:", shares)
    check_eq(sorted(r[0] for r in shares), ["reconciler", "worker"],
             "roles holding a share")


if __name__ == "__main__":
    raise SystemExit(e2e.main(scenario))
