#!/usr/bin/env python3
"""chargectl attempt resolve --failed, given the attempt's id in upper case,
agrees that no money moved while psp-sim charged the attempt's key and
both the provider's search and its list hold that charge (issue 34,
adversary round 2: a UUID written in either case; the review's look-ups
compare it as text).

Attempt A's charge executes at psp-sim and is answered 500 (error_after):
the worker leaves A UNKNOWN. Past the key's window the reconciler finds
A's intent (it only names A: unproven) and puts A in review. An operator
resolves A --failed, pasting A's id in upper case (a UUID is the same id
in either case: charge_command_is_uuid accepts it, the database reads it
as a uuid and finds A). The review then searches the provider for
metadata['payment_attempt_id']:'<UPPER>' and walks the list matching the
metadata against '<UPPER>' byte for byte (provider_client.c): neither
finds A's intent, so the provider "agrees" and A is FAILED (charge.failed:
the order service charges the order again), although psp-sim's ledger
shows A's key charged and succeeded. With the id in lower case the same
resolve is refused (checked first: nothing is written)."""
import time

import charged_e2e as e2e
from charged_e2e import check, check_eq
import test_chargectl_resolve as res
import test_reconciler_branches as rb


def review_failed_upper_case(new):
    retention, lag = 3000, 1000
    cmd = e2e.new_command()
    aid, key = cmd["payment_attempt_id"], cmd["idempotency_key"]
    s = new("own_review_case", psp_args=[
        "--key-retention-ms", str(retention), "--fault", "error_after=1@%s#1" % key])
    env = dict(rb.RECONCILER, WORKER_KEY_RETENTION_MS=retention,
               RECONCILER_SEARCH_LAG_MS=lag)
    s.start_worker(**dict(rb.WORKER, RECONCILER_FIRST_LOOK_MS=600000,
                          WORKER_KEY_RETENTION_MS=retention))
    s.publish([cmd])
    s.wait_settled(1, timeout=60)
    check_eq(rb.attempt(s, aid)["status"], "UNKNOWN", "status the worker left")
    charges = rb.charges_of_key(s, key)
    check_eq([c["outcome"] for c in charges], ["succeeded"], "psp-sim's charges of A's key")
    e2e.wait_until("A's key past its window and the search's lag", lambda: float(s.query(
        "SELECT extract(epoch FROM now() - first_sent_at) * 1000 FROM payment_attempts"
        " WHERE id = '%s'" % aid)[0][0]) > retention + lag + 500, 30)
    s.psql(s.db, "UPDATE payment_attempts SET next_check_at = now() WHERE id = '%s'" % aid)
    r = s.start_reconciler(**env)
    a = rb.wait_status(s, aid, ["REQUIRES_REVIEW"], 30, stays=rb.OPEN)
    check_eq(s.stop_reconciler(r), 0, "the reconciler's exit after SIGTERM")
    e2e.log("A in review:", a["reason"])

    def resolve(attempt_id):
        return res.ctl(s, "attempt", "resolve", attempt_id, "--failed", "--reason",
                       "the provider lists no charge for this attempt", "--actor", "erin",
                       env={"RECONCILER_SEARCH_LAG_MS": str(lag)})
    p = resolve(aid)
    e2e.log("resolve --failed (lower case): exit %d %s"
            % (p.returncode, p.stderr.decode().strip()))
    check_eq(p.returncode, 1, "exit status of resolve --failed, id in lower case")
    p = resolve(aid.upper())
    if p.returncode != 0 and "try again" in p.stderr.decode():
        e2e.log("resolve --failed: %s; again after the lag" % p.stderr.decode().strip())
        time.sleep(lag / 1000 + 0.5)
        p = resolve(aid.upper())
    err = p.stderr.decode().strip()
    e2e.log("resolve --failed (upper case): exit %d %s %s"
            % (p.returncode, err, p.stdout.decode().strip()))
    status = rb.attempt(s, aid)["status"]
    check(status != "FAILED",
          "A resolved FAILED given its id in upper case (exit %d) although psp-sim charged"
          " A's key (%s, succeeded) and its search and list hold that intent: %s"
          % (p.returncode, charges[0]["payment_intent_id"], rb.describe(s, aid)))
    check_eq(p.returncode, 1, "exit status of resolve --failed, id in upper case")


SCENARIOS = [review_failed_upper_case]


if __name__ == "__main__":
    raise SystemExit(e2e.main(e2e.run_scenarios(SCENARIOS)))
