#!/usr/bin/env python3
"""Adversary 38, break: a 429 to the reconciler's look-up is treated as a
look that found nothing: the attempt goes back on RECONCILER_SCHEDULE_MS
(60 s, then 5 min, 15 min, 1 h, ...), Retry-After ignored. Issue 38: "A 429
is not an outage ... it honours Retry-After when given, or backs off".

Six charges are left UNKNOWN (psp-sim executes them and answers 500:
error_after; WORKER_UNKNOWN_RETRIES=0). psp-sim throttles the classes the
reconciler's looks use (its charge sent again with the attempt's key:
create; retrieve, search, list) at 2/s each (burst 1) and sends Retry-After (1 s); nothing else
competes for them. Honouring Retry-After, the reconciler settles the six in
a few seconds; it settles the one or two its first looks got through for,
and the rest wait a minute (and the next 429, five more)."""
import charged_e2e as e2e
from charged_e2e import check

N = 6
ENV = {"WORKER_UNKNOWN_RETRIES": "0", "RECONCILER_FIRST_LOOK_MS": "0",
       "RECONCILER_POLL_MS": "200"}
SETTLE_S = 12


def unknown(s):
    return int(s.query("SELECT count(*) FROM payment_attempts WHERE status = 'UNKNOWN'")[0][0])


def scenario(new):
    s = new("adv38_rec429", partitions=4, worker_env=ENV,
            psp_args=["--fault", "error_after=1", "--rate-limit-retry-after",
                      "--rate-limit-class", "retrieve=2:1", "--rate-limit-class", "search=2:1",
                      "--rate-limit-class", "list=2:1", "--rate-limit-class", "create=2:1"])
    w = s.start_worker()
    s.wait_group_settled([w])
    s.publish([e2e.new_command(amount=100 + i) for i in range(N)])
    e2e.wait_until("%d attempts UNKNOWN" % N, lambda: unknown(s) == N, e2e.scaled(30), 0.2)
    s.psp_put("/faults", {}, method="DELETE")
    s.start_reconciler()
    try:
        e2e.wait_until("the UNKNOWN attempts settled", lambda: unknown(s) == 0,
                       SETTLE_S, 0.5)
    except e2e.Failure:
        pass
    left = unknown(s)
    rl = s.psp_get("/rate-limits")
    e2e.log("psp-sim throttled:", rl["throttled"], "UNKNOWN left:", left, "per second:",
            [(q["served"], q["throttled"]) for q in rl["per_second"]])
    e2e.log("checks:", s.query("SELECT reconcile_checks, next_check_at > now() + interval '30 s', count(*)"
                               " FROM payment_attempts GROUP BY 1, 2"))
    check(left == 0,
          "%d of %d UNKNOWN attempts still unsettled %d s after the reconciler started, "
          "with psp-sim throttling look-ups at 2/s and sending Retry-After: a 429'd look "
          "waits out RECONCILER_SCHEDULE_MS (60 s first), not Retry-After"
          % (left, N, SETTLE_S))
    # A throttled look is no look: only the look that settled each is counted.
    counted = int(s.query("SELECT coalesce(max(reconcile_checks), 0) FROM payment_attempts")[0][0])
    check(counted <= 1,
          "an attempt's reconcile_checks reached %d: throttled looks were counted "
          "(they must not advance RECONCILER_SCHEDULE_MS)" % counted)
    s.check_invariants()


if __name__ == "__main__":
    raise SystemExit(e2e.main(scenario))
