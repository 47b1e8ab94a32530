#!/usr/bin/env python3
"""Adversary 38j: under a binding fleet budget, one stray 429 sends a charge
to the back of the queue, behind every charge that came after it.

Jobs that wait for the budget are parked (engine_core_budget), so under a
budget that binds, parked jobs fill WORKER_MAX_IN_FLIGHT all the time, and
any throttled charge is set aside rather than parked. A parked one would be
sent again when due, ahead of new messages; a set-aside one is the
reconciler's, whose calls draw on the budget at the look-ups' priority,
below every charge (BUDGET_PRIO_LOOKUP): while the workers have charges
waiting, it gets nothing, and the charge it would send again waits for the
whole backlog behind it.

The break (branch adv38j, 4 runs of 4 fail; the parent of the set-aside
commit passes, 3 of 3): one worker (WORKER_MAX_IN_FLIGHT 10) and a
reconciler, the fleet budget 25/s (chargectl provider limits set --global
25), 1,000 charges with 5 of pm_card_mastercard after the 80th; psp-sim
answers the card's first 5 calls 429. Every charge so answered was set
aside, and was still unsettled 12.3-17.5 s after its 429 (the window's
end, or the reconciler's call at last) while 334-427 charges published
after them settled; the reconciler's calls were "no share for a lookup
request (create) within 2000 ms: the limit is taken by requests of a
higher priority", its waits growing as for 429s (1, 2, 4, 8 s). The parent
commit, parked: each settled 0.6-2.4 s after its 429. Jobs waiting for the
budget are parked and count among the parked ones, so under a budget that
binds every throttled charge is set aside: the fix of one hot card demotes
any throttled charge below every new one."""
import os
import time

import charged_e2e as e2e
from charged_e2e import check

HOT = "pm_card_mastercard"
N = 1000
N_HOT = 5
AT = 80  # the card's commands after the first AT: the backlog waits for the budget
RPS = 25
MAX_IN_FLIGHT = int(os.environ.get("ADV_MAX_IN_FLIGHT", "10"))
WITHIN_S = 5
WATCH_S = 15


def scenario(new):
    s = new("adv38j_aside_budget", partitions=4, worker_env={"RECONCILER_POLL_MS": "200"})
    s.set_limits("--global", str(RPS), actor="adv38j")
    s.psp_put("/faults", {"seed": 1, "rules": [
        {"kind": "rate_limit", "probability": 1.0, "payment_method": HOT, "times": N_HOT}]})
    w = s.start_worker(WORKER_MAX_IN_FLIGHT=MAX_IN_FLIGHT)
    s.start_reconciler()
    s.wait_group_settled([w])
    cmds = [e2e.new_command(amount=20000 + i) for i in range(N)]
    for i in range(N_HOT):
        cmds.insert(AT + i, e2e.new_command(amount=500 + i, payment_method=HOT))
    s.publish(cmds)

    def count(where):
        return int(s.query("SELECT count(*) FROM payment_attempts WHERE " + where)[0][0])

    def throttled():
        return len([h for h in s.psp_get("/faults").get("hits", []) if h["kind"] == "rate_limit"])

    good = "amount >= 20000 AND status = 'SUCCEEDED'"
    # The card's commands are reached when the fetch reaches their
    # partitions: at 25/s, up to the whole 40 s backlog.
    e2e.wait_until("psp-sim throttled the card", lambda: throttled() > 0, 45, 0.1)
    good0 = count(good)
    # psp-sim's 429s so far, recorded with their attempts.
    calls429 = "SELECT count(*) FROM provider_calls WHERE http_status = 429"

    def recorded(least):
        n = throttled()
        return n >= least and int(s.query(calls429)[0][0]) >= n
    e2e.wait_until("the card's first 429 recorded", lambda: recorded(1), e2e.scaled(10), 0.2)
    unsettled = ("SELECT count(*) FROM payment_attempts p WHERE p.status <> 'SUCCEEDED' AND"
                 " EXISTS (SELECT 1 FROM provider_calls c WHERE c.payment_attempt_id = p.id"
                 " AND c.http_status = 429)")
    try:
        # Three of the card's 429s at least (its commands are spread over
        # the partitions), and every charge they answered settled.
        e2e.wait_until("every charge answered 429 settled",
                       lambda: recorded(3) and int(s.query(unsettled)[0][0]) == 0,
                       WATCH_S, 0.5)
    except e2e.Failure:
        pass
    good1 = count(good)
    # Each charge the provider answered 429: from its first 429 to its
    # settlement (or now, when unsettled), on the database's clock.
    rows = s.query(
        "SELECT p.id, p.status, extract(epoch FROM coalesce(max(t.created_at) FILTER"
        "  (WHERE t.new_status = 'SUCCEEDED'), now()) - min(c.started_at)),"
        "  bool_or(t.old_status = 'PROCESSING' AND t.new_status = 'PROCESSING'"
        "    AND t.reason LIKE 'provider_throttled:%')"
        " FROM payment_attempts p JOIN provider_calls c ON c.payment_attempt_id = p.id"
        "  AND c.http_status = 429"
        " LEFT JOIN attempt_transitions t ON t.payment_attempt_id = p.id"
        " GROUP BY 1, 2 ORDER BY 3")
    waits = [(r[1], float(r[2]), r[3] == "t") for r in rows]
    e2e.log("the 429'd charges (status, s from the first 429, set aside): %s; %d good "
            "charges settled meanwhile" % (waits, good1 - good0))
    check(waits, "psp-sim throttled no charge")
    late = [w for w in waits if w[1] > WITHIN_S]
    said = ", ".join("%.1f s%s" % (w[1], " set aside" if w[2] else "") for w in late)
    check(not late,
          "%d of %d charges answered one 429 waited more than %d s (%s) while %d charges "
          "published after them settled, under a fleet budget of %d/s: set aside for the "
          "reconciler, whose call draws on the budget below every charge (parked ones "
          "settle in about a second)"
          % (len(late), len(waits), WITHIN_S, said, good1 - good0, RPS))


if __name__ == "__main__":
    raise SystemExit(e2e.main(scenario))
