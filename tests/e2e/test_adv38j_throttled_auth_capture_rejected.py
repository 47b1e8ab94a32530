#!/usr/bin/env python3
"""Adversary 38j: one 429 to an authorization gets its capture REJECTED.

A throttled authorization is sent again under its key (parked, or set
aside for the reconciler). The worker takes any answer to a second call
of a claim as a possible replay (engine_core's decide: may_replay when
calls > 1), and an authorization's requires_capture that may be a replay
proves the intent ours but not its state now: it settles UNKNOWN for the
reconciler to retrieve. But a 429 is refused before anything executes
(psp-sim, as Stripe): the second call is the first execution, its answer
no replay. The capture behind it in the partition then finds its
authorization UNKNOWN and is REJECTED at once (capture_store's claim:
"not_authorized: payment attempt ... is UNKNOWN"); the reconciler later
finds the hold AUTHORIZED, and nothing ever captures it: the money held,
the order unpaid, the capture command lost.

The break (branch adv38j, 3 runs of 3; the same on the parent of the
set-aside commit: not the set-aside's doing): one worker, psp-sim
answering each of 3 authorizations' first call 429 and serving everything
after; each authorization followed by its capture on one partition. In
under 2 s: 3 of 3 authorizations UNKNOWN ("outcome_unknown: requires_capture
answered again under the key (a replay ...)"), 3 of 3 captures REJECTED
("not_authorized: payment attempt ... is UNKNOWN")."""
import authorization_steps as steps
import charged_e2e as e2e
from charged_e2e import check

HOT = "pm_card_mastercard"
N = 3
WITHIN_S = 15


def scenario(new):
    s = new("adv38j_auth_capture", partitions=1)
    # One 429 to each authorization's first call; all served after.
    s.psp_put("/faults", {"seed": 1, "rules": [
        {"kind": "rate_limit", "probability": 1.0, "payment_method": HOT, "times": N}]})
    w = s.start_worker()
    s.wait_group_settled([w])
    recs, caps = [], []
    for i in range(N):
        auth = e2e.new_command(amount=500 + i, payment_method=HOT)
        auth["type"] = "authorization.requested"
        cap = steps.new_capture(auth)
        recs += [auth, cap]
        caps.append(cap)
    steps.produce(s, recs)

    def open_(table):
        return int(s.query("SELECT count(*) FROM %s WHERE status IN ('PENDING', 'PROCESSING')"
                           % table)[0][0])
    try:
        e2e.wait_until("the authorizations and captures settled",
                       lambda: int(s.query("SELECT count(*) FROM capture_attempts")[0][0]) == N
                       and open_("payment_attempts") == 0 and open_("capture_attempts") == 0,
                       WITHIN_S, 0.2)
    except e2e.Failure:
        pass
    auths = s.query("SELECT status, coalesce(reason, ''), count(*) FROM payment_attempts"
                    " GROUP BY 1, 2")
    got = s.query("SELECT status, coalesce(reason, ''), count(*) FROM capture_attempts"
                  " GROUP BY 1, 2")
    hits = len([h for h in s.psp_get("/faults").get("hits", []) if h["kind"] == "rate_limit"])
    e2e.log("psp-sim's 429s: %d; authorizations: %s; captures: %s" % (hits, auths, got))
    rejected = sum(int(r[2]) for r in got if r[0] == "REJECTED")
    check(rejected == 0,
          "%d of %d captures REJECTED after one 429 to each of their authorizations "
          "(psp-sim serving everything after): the call again under the key is taken for "
          "a possible replay, the authorization settles UNKNOWN, and its capture is "
          "refused for it (see the log line above)" % (rejected, N))
    check(all(r[0] == "SUCCEEDED" for r in got) and sum(int(r[2]) for r in got) == N,
          "captures not SUCCEEDED within %d s: %s" % (WITHIN_S, got))


if __name__ == "__main__":
    raise SystemExit(e2e.main(scenario))
