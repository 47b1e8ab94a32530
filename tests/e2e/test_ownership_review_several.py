#!/usr/bin/env python3
"""chargectl attempt resolve --succeeded, without --force, books another
client's intent for attempt A while the provider holds A's own succeeded
charge under A's key (issue 34, adversary round 2: a review that reads
one search hit of several).

Another client charges first, under its own key, with metadata naming
attempt A and its order (same amount and currency): pi_F. A's own charge
then executes at psp-sim and is answered 500 (error_after): the worker
leaves A UNKNOWN. Past the key's window the reconciler finds two intents
naming A and puts A in review (neither is proven A's). An operator resolves
A --succeeded pi_F: the review's search for A answers two succeeded
intents, but attempt_review.c judge_succeeded looks only at the one the
client ranked first (the oldest: pi_F) and calls that "listed under this
attempt", so the provider "agrees" and pi_F is booked as A's charge,
while psp-sim's ledger shows A's own key charged and succeeded on
another intent, which stays unbooked. The provider's search holding
another succeeded intent for the attempt is exactly what the review
otherwise refuses ("the provider's succeeded intent for this attempt is
X, not Y"): the resolve must be refused without --force.

resolve_foreign_search_lags: the same, but when the resolve asks,
psp-sim's search lags (PUT /search-lag) past A's own charge and not past
the older foreign one: the search answers pi_F alone (one match), the
review never walks the provider's consistent list for --succeeded, and
pi_F is booked for A just the same. Counting the search's matches is not
enough: the list (as --failed walks it) holds A's own succeeded intent."""
import json
import time

import charged_e2e as e2e
from charged_e2e import check, check_eq
import charged_other_client as other
import test_chargectl_resolve as res
import test_reconciler_branches as rb


def resolve_foreign_among_several(new, search_lags=False):
    retention, lag = 3000, 1000
    cmd = e2e.new_command()
    aid, key = cmd["payment_attempt_id"], cmd["idempotency_key"]
    s = new("own_review_several", psp_args=[
        "--key-retention-ms", str(retention),
        "--fault", "error_after=1@%s#1" % key])
    foreign = other.charge_naming(s, cmd, "pm_card_visa")
    check_eq(foreign["status"], "succeeded", "the other client's charge naming A")
    if search_lags:
        # pi_F made well before A's own charge: a lag can fall between them.
        made = time.time()
        e2e.wait_until("pi_F 4 s old", lambda: time.time() - made > 4, 10)
    env = dict(rb.RECONCILER, WORKER_KEY_RETENTION_MS=retention,
               RECONCILER_SEARCH_LAG_MS=lag)
    s.start_worker(**dict(rb.WORKER, RECONCILER_FIRST_LOOK_MS=600000,
                          WORKER_KEY_RETENTION_MS=retention))
    s.publish([cmd])
    s.wait_settled(1, timeout=60)
    check_eq(rb.attempt(s, aid)["status"], "UNKNOWN", "status the worker left")
    charges = rb.charges_of_key(s, key)
    check_eq([c["outcome"] for c in charges], ["succeeded"], "psp-sim's charges of A's key")
    own = charges[0]["payment_intent_id"]
    check(own != foreign["id"], "A's own intent is not the other client's")
    e2e.wait_until("A's key past its window", lambda: float(s.query(
        "SELECT extract(epoch FROM now() - first_sent_at) * 1000 FROM payment_attempts"
        " WHERE id = '%s'" % aid)[0][0]) > retention + lag + 500, 30)
    s.psql(s.db, "UPDATE payment_attempts SET next_check_at = now() WHERE id = '%s'" % aid)
    r = s.start_reconciler(**env)
    a = rb.wait_status(s, aid, ["REQUIRES_REVIEW"], 30, stays=rb.OPEN)
    check_eq(s.stop_reconciler(r), 0, "the reconciler's exit after SIGTERM")
    e2e.log("A in review:", a["reason"])

    if search_lags:
        own_at = [c["at_ms"] for c in charges][0]
        behind = int(time.time() * 1000) - own_at + 1500
        check(int(time.time() * 1000) - foreign_at(s, foreign["id"]) > behind + 1000,
              "pi_F older than the lag")
        s.psp_put("/search-lag", {"search_lag_ms": behind})
        e2e.log("psp-sim's search lags %d ms: it shows pi_F, not A's own" % behind)
    p = res.ctl(s, "attempt", "resolve", aid, "--succeeded", foreign["id"], "--json",
                "--actor", "erin", env={"RECONCILER_SEARCH_LAG_MS": str(lag)})
    e2e.log("resolve --succeeded %s: exit %d %s %s" % (
        foreign["id"], p.returncode, p.stderr.decode().strip(),
        p.stdout.decode().strip()[:600]))
    searched = [l for l in (json.loads(p.stdout.decode() or "{}").get("evidence") or {})
                .get("lookups", []) if l.get("operation") == "search"]
    e2e.log("the review's search:", searched)
    after = rb.attempt(s, aid)
    booked = rb.ledger_entries(s, aid)
    ledger = {c["payment_intent_id"]: c for c in s.ledger()}
    e2e.log("A now:", after, "booked:", booked, "psp-sim A's key:",
            ledger[own]["idempotency_key"] == key, ledger[own]["outcome"])
    check(not (after["status"] == "SUCCEEDED" and after["ppid"] == foreign["id"]),
          "A resolved SUCCEEDED on the other client's %s without --force (ledger rows"
          " %s) although psp-sim charged A's own key as %s (succeeded, unbooked) and"
          " the review's search answered %s: %s"
          % (foreign["id"], booked, own, searched, rb.describe(s, aid)))
    check_eq(p.returncode, 1, "exit status of resolve --succeeded")


def foreign_at(s, intent):
    return [c["at_ms"] for c in s.ledger() if c["payment_intent_id"] == intent][0]


def resolve_foreign_search_lags(new):
    resolve_foreign_among_several(new, search_lags=True)


SCENARIOS = [resolve_foreign_among_several, resolve_foreign_search_lags]


if __name__ == "__main__":
    raise SystemExit(e2e.main(e2e.run_scenarios(SCENARIOS)))
