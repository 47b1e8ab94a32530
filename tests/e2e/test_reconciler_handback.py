#!/usr/bin/env python3
"""Regression scenario (fails against the reconciler as of this writing):
a reconciler stopped with SIGTERM hands the rest of its batch back, so a
peer may look at once (docs/reconciler.md, "Stopping"; release_rest in
worker/roles/reconciler.c). That must hold for provider-processing attempts as
for UNKNOWN ones, and a handed-back processing attempt is still one "the
provider reported as processing": a re-sent command must not make a worker
call the provider for it again (docs/worker.md, step 4).

Setup: 5 UNKNOWN attempts (error_after on pm_card_visa) and 5 provider-
processing ones (pm_card_processing, then settled succeeded at psp-sim). A
first reconciler whose provider never answers (a socket that accepts and
stays silent; PROVIDER_TIMEOUT_MS 1 s) claims all 10 in one batch and is
stopped after about 2 s, inside the batch. Then the processing commands are
published again with a worker running, and a second reconciler (psp-sim's
URL, default RECONCILER_STALE_LEASE_MS) must settle all 10 within 15 s.

What happens: attempt_store_release only sets lease_expires_at = now() and
keeps lease_owner; attempt_store_claim_due takes a PROCESSING attempt only
with lease_owner IS NULL or a lease expired RECONCILER_STALE_LEASE_MS ago
(5 min), while the worker's claim takes any PROCESSING attempt with an
owner and an expired lease ('lease expired; taken over') and POSTs again."""
import socket
import threading
import time

import charged_e2e as e2e
from charged_e2e import check, check_eq

# Every visa charge answers 500: to the worker's breaker that is an outage,
# whose opening failure counts no try; it would send them again (replayed,
# SUCCEEDED) instead of leaving them UNKNOWN for the reconciler.
WORKER = {"WORKER_UNKNOWN_RETRIES": 0, "RECONCILER_FIRST_LOOK_MS": 0,
          "PROVIDER_TIMEOUT_MS": 1000, "WORKER_LEASE_MS": 5000,
          "PROVIDER_BREAKER_FAILURE_RATE": 0}
RECONCILER = {"RECONCILER_SCHEDULE_MS": 200, "RECONCILER_POLL_MS": 100,
              "PROVIDER_TIMEOUT_MS": 1000}


def silent_provider():
    """A port that accepts connections and never answers."""
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(64)
    held = []

    def accept():
        while True:
            c, _ = srv.accept()
            held.append(c)
    threading.Thread(target=accept, daemon=True).start()
    return srv.getsockname()[1]


def rows(s):
    return {r[0]: {"status": r[1], "pm": r[2], "owner": r[3], "checks": int(r[4])}
            for r in s.query("SELECT id, status, payment_method, coalesce(lease_owner, ''), "
                             "reconcile_checks FROM payment_attempts")}


def scenario(new):
    s = new("rec_handback", psp_args=["--fault", "error_after=1@pm_card_visa"])
    processing = [e2e.new_command(payment_method="pm_card_processing") for _ in range(5)]
    cmds = processing + [e2e.new_command() for _ in range(5)]
    s.start_worker(**WORKER)
    s.publish(cmds)
    s.wait_settled(len(cmds), timeout=60)
    got = sorted((a["pm"], a["status"]) for a in rows(s).values())
    check_eq(got, sorted([("pm_card_processing", "PROCESSING")] * 5 +
                         [("pm_card_visa", "UNKNOWN")] * 5), "what the worker left")
    for c in s.ledger():
        if c["outcome"] == "processing":
            s.psp_put("/intents/%s/settle" % c["payment_intent_id"], {"status": "succeeded"},
                      method="POST")

    first = s.start_reconciler(PROVIDER_BASE_URL="http://127.0.0.1:%d" % silent_provider(),
                               RECONCILER_BATCH=16, **RECONCILER)
    owner = s.worker_ids[first]
    e2e.wait_until("the first reconciler claimed all 10",
                   lambda: all(r["owner"] == owner for r in rows(s).values()), 10, 0.05)
    time.sleep(1.5)  # one or two looks of 1 s each: inside the batch
    check_eq(s.stop_reconciler(first), 0, "exit status of the first reconciler after SIGTERM")
    back = {aid: r for aid, r in rows(s).items() if r["checks"] == 0}
    back_processing = [aid for aid, r in back.items() if r["status"] == "PROCESSING"]
    check(back_processing, "no processing attempt was handed back (looked at all?): %s" % back)
    e2e.log("handed back: %d (%d PROCESSING)" % (len(back), len(back_processing)))

    problems = []
    # Half of them: a re-sent command must not make a worker call again.
    back_processing.sort()
    resent, rest = back_processing[:len(back_processing) // 2], back_processing[len(back_processing) // 2:]
    s.publish([c for c in processing if c["payment_attempt_id"] in resent])
    time.sleep(3)
    again = s.query("SELECT payment_attempt_id, count(*) FROM provider_calls "
                    "WHERE operation = 'charge' AND payment_attempt_id IN ('%s') "
                    "GROUP BY 1 HAVING count(*) > 1" % "','".join(resent))
    if again:
        problems.append("a worker called the provider again for %d of %d handed-back "
                        "provider-processing attempts whose command was re-sent "
                        "(transitions of one: %s)" % (
                            len(again), len(resent), s.query(
                                "SELECT old_status, new_status, actor, reason "
                                "FROM attempt_transitions WHERE payment_attempt_id = "
                                "'%s' ORDER BY id" % again[0][0])))
    # The others: a peer reconciler must look at them at once.
    s.start_reconciler(**RECONCILER)
    peer = [aid for aid in back if aid not in resent]
    try:
        e2e.wait_until("the handed-back attempts SUCCEEDED", lambda: all(
            rows(s)[aid]["status"] == "SUCCEEDED" for aid in peer), 15, 0.2)
    except e2e.Failure as e:
        left = [aid for aid, r in rows(s).items() if aid in peer and r["status"] != "SUCCEEDED"]
        problems.append("%s: a peer reconciler did not look at %d of %d handed-back "
                        "attempts (%d of them PROCESSING): %s" % (
                            e, len(left), len(peer), len(rest), s.query(
                                "SELECT status, lease_owner, lease_expires_at < now(), "
                                "reconcile_checks FROM payment_attempts WHERE id IN ('%s')"
                                % "','".join(left))))
    check(not problems, lambda: "; ".join(problems))
    s.check_invariants()


if __name__ == "__main__":
    raise SystemExit(e2e.main(scenario))
