#!/usr/bin/env python3
"""chargectl refund resolve --status FAILED, given the refund's id in upper
case, gives its reservation back while the refund executed under its key
(issue 34, adversary round 2: a UUID written in either case; the review's
list compares it as text).

Charge A (1,000) succeeds. Refund R (500) executes at psp-sim but its
answer is lost (stall_after): R is UNKNOWN, with no provider refund id.
Once no call under R's key may still execute (its last call older than
WORKER_KEY_RETENTION_MS, no lease), an operator resolves R FAILED. With
R's id in lower case the provider's list of A's refunds holds R's own
succeeded refund (its metadata[refund_id] is R's): refused, nothing
written. With R's id in upper case (the same UUID: charge_command_is_uuid
accepts it, the database reads it as a uuid and finds R), ctl_refund.c
lists A's refunds matching metadata[refund_id] against '<UPPER>' byte for
byte (provider_client.c take_best_refund): none, so the provider "agrees",
R is FAILED and A's 500 reservation is given back although psp-sim's
ledger shows R's key refunded 500, succeeded: a new refund would take A's
refunds past what is left."""
import charged_e2e as e2e
from charged_e2e import check, check_eq

AMOUNT = 1000
RETENTION = 3000
ENV = {"WORKER_UNKNOWN_RETRIES": "0", "RECONCILER_FIRST_LOOK_MS": "600000"}


def refund_row(s, rid):
    # No row yet (the worker has not recorded the command): a row of
    # Nones, so that a wait on its status goes on waiting.
    rows = s.query("SELECT status, coalesce(provider_refund_id, ''),"
                   " coalesce(lease_expires_at > now(), false)::text FROM refund_attempts"
                   " WHERE id = '%s'" % rid)
    return rows[0] if rows else [None, None, None]


def reserved(s, aid):
    return int(s.query("SELECT refund_reserved FROM payment_attempts WHERE id = '%s'"
                       % aid)[0][0])


def refund_failed_upper_case(new):
    s = new("own_refund_resolve_case", partitions=1, worker_env=ENV)
    w = s.start_worker()
    e2e.wait_until("worker ready", lambda: s.admin_get(w, "/readyz")[0] == 200, 60)
    charge = e2e.new_command(amount=AMOUNT)
    aid = charge["payment_attempt_id"]
    s.publish([charge])
    e2e.wait_until("A to succeed", lambda: s.query(
        "SELECT status FROM payment_attempts WHERE id = '%s'" % aid) == [["SUCCEEDED"]], 60)
    intent = s.query("SELECT provider_payment_id FROM payment_attempts WHERE id = '%s'"
                     % aid)[0][0]

    refund = e2e.new_refund(charge, 500)
    rid = refund["refund_id"]
    s.psp_put("/faults", {"stall_ms": 3000, "rules": [
        {"kind": "stall_after", "probability": 1, "key": refund["idempotency_key"],
         "times": 1}]})
    s.publish([refund])
    e2e.wait_until("R to be UNKNOWN", lambda: refund_row(s, rid)[0] == "UNKNOWN", 60)
    own = [r for r in s.psp_get("/ledger")["refunds"]
           if r["idempotency_key"] == refund["idempotency_key"]]
    check_eq([(r["payment_intent_id"], r["amount"], r["status"]) for r in own],
             [(intent, 500, "succeeded")], "psp-sim's refunds under R's key")
    check_eq(reserved(s, aid), 500, "A's reservation while R is unsettled")
    e2e.wait_until("R's key past WORKER_KEY_RETENTION_MS, no lease", lambda: refund_row(
        s, rid)[2] == "false" and float(s.query(
            "SELECT extract(epoch FROM now() - max(coalesce(recorded_at, started_at)))"
            " * 1000 FROM provider_calls WHERE refund_id = '%s'" % rid)[0][0])
        > RETENTION + 500, 30)

    def resolve(refund_id):
        p = s.run([e2e.CHARGECTL, "refund", "resolve", refund_id, "--status", "FAILED",
                   "--reason", "the provider lists no refund for R", "--actor", "erin"],
                  check=False, extra_env={"WORKER_KEY_RETENTION_MS": str(RETENTION)})
        e2e.log("resolve %s FAILED: exit %d %s" % (refund_id, p.returncode,
                                                   p.stderr.decode().strip()))
        return p
    p = resolve(rid)
    check_eq(p.returncode, 1, "exit status of resolve FAILED, id in lower case")
    check_eq(refund_row(s, rid)[0], "UNKNOWN", "R after a refused resolve")
    p = resolve(rid.upper())
    status = refund_row(s, rid)[0]
    check(status != "FAILED",
          "R resolved FAILED given its id in upper case (exit %d), A's reservation now %d,"
          " although psp-sim refunded 500 of %s under R's key (%s, succeeded) and lists"
          " it among %s's refunds" % (p.returncode, reserved(s, aid), intent,
                                      own[0]["provider_refund_id"], intent))
    check_eq(p.returncode, 1, "exit status of resolve FAILED, id in upper case")
    check_eq(reserved(s, aid), 500, "A's reservation")


SCENARIOS = [refund_failed_upper_case]


if __name__ == "__main__":
    raise SystemExit(e2e.main(e2e.run_scenarios(SCENARIOS)))
