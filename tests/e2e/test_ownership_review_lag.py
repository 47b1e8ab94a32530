#!/usr/bin/env python3
"""chargectl attempt resolve --failed agrees on a search that lags, while
the provider's consistent list holds the attempt's succeeded charge
(issue 34, adversary: provider evidence that lags).

Attempt A's charge executes at psp-sim and is answered 500 (error_after):
the worker leaves A UNKNOWN. No reconciler looks inside the key's window
(3 s). psp-sim's search lags 600 s, more than RECONCILER_SEARCH_LAG_MS
(1 s here): reconciler.md says search "may lag longer than anyone
configured, so its 'none' is never enough". Past the window the reconciler
walks the consistent list, finds A's intent, which only names A
(unproven): REQUIRES_REVIEW. An operator then resolves A --failed: the
review asks only the search (attempt_review.c judge_failed), which does not
list A's intent yet; once the last call is older than
RECONCILER_SEARCH_LAG_MS it "agrees", and A is FAILED (charge.failed: the
order service charges the order again) although psp-sim's ledger shows A's
key charged and succeeded. The resolve must be refused without --force."""
import time

import charged_e2e as e2e
from charged_e2e import check, check_eq
import test_chargectl_resolve as res
import test_reconciler_branches as rb


def review_failed_on_lagging_search(new):
    retention, lag = 3000, 1000
    cmd = e2e.new_command()
    aid, key = cmd["payment_attempt_id"], cmd["idempotency_key"]
    s = new("own_review_lag", psp_args=[
        "--key-retention-ms", str(retention), "--search-lag-ms", "600000",
        "--fault", "error_after=1@%s#1" % key])
    env = dict(rb.RECONCILER, WORKER_KEY_RETENTION_MS=retention,
               RECONCILER_SEARCH_LAG_MS=lag)
    s.start_worker(**dict(rb.WORKER, RECONCILER_FIRST_LOOK_MS=600000,
                          WORKER_KEY_RETENTION_MS=retention))
    s.publish([cmd])
    s.wait_settled(1, timeout=60)
    check_eq(rb.attempt(s, aid)["status"], "UNKNOWN", "status the worker left")
    charges = rb.charges_of_key(s, key)
    check_eq([c["outcome"] for c in charges], ["succeeded"], "psp-sim's charges of A's key")
    # Past the key's window before any look: the reconciler can only walk
    # the list (its due time is forced now).
    e2e.wait_until("A's key past its window", lambda: float(s.query(
        "SELECT extract(epoch FROM now() - first_sent_at) * 1000 FROM payment_attempts"
        " WHERE id = '%s'" % aid)[0][0]) > retention + lag + 500, 30)
    s.psql(s.db, "UPDATE payment_attempts SET next_check_at = now() WHERE id = '%s'" % aid)
    r = s.start_reconciler(**env)
    a = rb.wait_status(s, aid, ["REQUIRES_REVIEW"], 30, stays=rb.OPEN)
    check_eq(s.stop_reconciler(r), 0, "the reconciler's exit after SIGTERM")
    e2e.log("A in review:", a["reason"])
    check(charges[0]["payment_intent_id"] in a["reason"],
          "the review's reason names A's intent: %r" % a["reason"])

    def resolve():
        return res.ctl(s, "attempt", "resolve", aid, "--failed", "--reason",
                       "the provider lists no charge for this attempt", "--actor", "erin",
                       env={"RECONCILER_SEARCH_LAG_MS": str(lag)})
    p = resolve()
    if p.returncode != 0 and "try again" in p.stderr.decode():
        e2e.log("resolve --failed: %s; again after the lag" % p.stderr.decode().strip())
        time.sleep(lag / 1000 + 0.5)
        p = resolve()
    err = p.stderr.decode().strip()
    e2e.log("resolve --failed: exit %d %s" % (p.returncode, err))
    status = rb.attempt(s, aid)["status"]
    check(status != "FAILED",
          "A resolved FAILED (exit %d) although psp-sim charged A's key (%s, succeeded)"
          " and its list holds that intent: %s"
          % (p.returncode, charges[0]["payment_intent_id"], rb.describe(s, aid)))
    check_eq(p.returncode, 1, "exit status of resolve --failed")


SCENARIOS = [review_failed_on_lagging_search]


if __name__ == "__main__":
    raise SystemExit(e2e.main(e2e.run_scenarios(SCENARIOS)))
