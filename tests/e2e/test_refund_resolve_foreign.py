#!/usr/bin/env python3
"""chargectl refund resolve --status SUCCEEDED books a provider refund only
when it is proven the refund's own (issue 34, break 5).

Charges A and B of 1000 each SUCCEED. Refund R (1000 of A) reaches the
provider as a 500 that executed nothing (psp-sim's error_before on R's
key), so the worker leaves R UNKNOWN (WORKER_UNKNOWN_RETRIES 0). Another
client of the provider account then refunds B's intent, 1000, with
metadata naming R and A: the provider's refund is succeeded, of R's amount
and names R, but it is B's money that went back.

- Resolving R SUCCEEDED with that refund must be refused, and refused even
  with --force: psp-sim's ledger shows the refund on B's intent, so it is
  provably another charge's. Nothing is written: R stays UNKNOWN and
  reserved, A shows nothing refunded, no ledger row holds the refund.
- A refund on A's own intent whose metadata names R but another payment
  attempt (B) is refused without --force, and booked with it (the evidence
  says forced): A's intent really was refunded."""
import json
import urllib.error
import urllib.parse
import urllib.request
import uuid

import charged_e2e as e2e
from charged_e2e import check, check_eq

AMOUNT = 1000


def psp_refund(s, payment_intent, amount, metadata):
    """POSTs a refund to psp-sim's provider API as another client would."""
    form = {"payment_intent": payment_intent, "amount": str(amount),
            "reason": "requested_by_customer"}
    form.update({"metadata[%s]" % k: v for k, v in metadata.items()})
    req = urllib.request.Request(
        "http://127.0.0.1:%d/v1/refunds" % s.psp_port,
        data=urllib.parse.urlencode(form).encode(), method="POST",
        headers={"Authorization": "Bearer " + e2e.API_KEY,
                 "Idempotency-Key": "elsewhere:" + str(uuid.uuid4()),
                 "Content-Type": "application/x-www-form-urlencoded"})
    with urllib.request.urlopen(req, timeout=30) as r:
        return json.load(r)


def resolve(s, rid, re_id, *extra):
    return s.run([e2e.CHARGECTL, "refund", "resolve", rid, "--status", "SUCCEEDED",
                  "--reason", "refunded per the provider's dashboard",
                  "--provider-refund-id", re_id, "--actor", "erin"] + list(extra),
                 check=False)


def books(s, rid, attempt):
    """R's status and reservation, A's refunded amount, and the ledger's
    refund rows of R, as charged's database holds them."""
    rows = s.query("SELECT r.status, r.reserved, coalesce(r.provider_refund_id, ''),"
                   " p.refunded_amount FROM refund_attempts r JOIN payment_attempts p"
                   " ON p.id = r.payment_attempt_id WHERE r.id = '%s'" % rid)
    status, reserved, re_id, refunded = rows[0]
    ledger = s.query("SELECT provider_refund_id, provider_payment_id, amount FROM"
                     " ledger_entries WHERE kind = 'refund' AND payment_attempt_id = '%s'"
                     % attempt)
    return (status, reserved in (True, "t"), re_id, int(refunded),
            [(r[0], r[1], int(r[2])) for r in ledger])


def scenario(new):
    s = new("refund_resolve_foreign")
    s.start_worker(WORKER_UNKNOWN_RETRIES=0, RECONCILER_FIRST_LOOK_MS=600000)
    a, b = e2e.new_command(amount=AMOUNT), e2e.new_command(amount=AMOUNT)
    s.publish([a, b])
    s.wait_settled(2, timeout=60)
    paid = {x["id"]: x for x in s.attempts()}
    check_eq([paid[c["payment_attempt_id"]]["status"] for c in (a, b)],
             ["SUCCEEDED", "SUCCEEDED"], "the two charges")
    pi_a, pi_b = (paid[c["payment_attempt_id"]]["ppid"] for c in (a, b))

    refund = e2e.new_refund(a, AMOUNT)
    rid = refund["refund_id"]
    s.psp_put("/faults", {"rules": [{"kind": "error_before", "probability": 1,
                                     "key": refund["idempotency_key"]}]})
    s.publish([refund])

    def left_unknown():
        rows = s.query("SELECT status, lease_owner IS NULL FROM refund_attempts"
                       " WHERE id = '%s'" % rid)
        return rows and rows[0][0] == "UNKNOWN" and rows[0][1] in (True, "t")
    e2e.wait_until("the worker to leave refund R UNKNOWN", left_unknown, 60)
    s.psp_put("/faults", {}, method="DELETE")
    check_eq(books(s, rid, a["payment_attempt_id"]), ("UNKNOWN", True, "", 0, []),
             "refund R before the review")

    # ---- a refund on B's intent that names R ----
    foreign = psp_refund(s, pi_b, AMOUNT, {"refund_id": rid,
                                          "payment_attempt_id": a["payment_attempt_id"]})
    check_eq((foreign["status"], foreign["amount"]), ("succeeded", AMOUNT),
             "the other client's refund")
    on_ledger = {r["provider_refund_id"]: r for r in s.psp_get("/ledger")["refunds"]}
    check_eq(on_ledger[foreign["id"]]["payment_intent_id"], pi_b,
             "psp-sim's ledger: the refund naming R is on B's intent")
    check_eq(sorted(r["payment_intent_id"] for r in on_ledger.values()), [pi_b],
             "psp-sim's ledger: A's intent was never refunded")

    for extra in ((), ("--force",)):
        p = resolve(s, rid, foreign["id"], *extra)
        err = p.stderr.decode().strip()
        e2e.log("resolve %s: exit %d, %s" % (" ".join(extra), p.returncode, err))
        got = books(s, rid, a["payment_attempt_id"])
        check(got[0] != "SUCCEEDED",
              "resolve %s booked %s for refund R of charge A (A refunded_amount %d, "
              "ledger %s) although psp-sim's ledger has it on B's intent %s"
              % (" ".join(extra) or "(no --force)", foreign["id"], got[3], got[4], pi_b))
        check_eq(p.returncode, 1, "exit status of resolve %s" % " ".join(extra))
        check("another charge's intent" in err and "\n" not in err,
              "resolve %s: want one line naming another charge's intent, got %r"
              % (" ".join(extra), err))
        check_eq(got, ("UNKNOWN", True, "", 0, []), "refund R after a refused resolve")

    # ---- a refund on A's intent that names R, and another attempt ----
    named = psp_refund(s, pi_a, AMOUNT, {"refund_id": rid,
                                        "payment_attempt_id": b["payment_attempt_id"]})
    p = resolve(s, rid, named["id"])
    err = p.stderr.decode().strip()
    check_eq(p.returncode, 1, "exit status of a resolve whose metadata names another "
             "attempt")
    check("names another" in err and "--force" in err, "stderr %r" % err)
    check_eq(books(s, rid, a["payment_attempt_id"]), ("UNKNOWN", True, "", 0, []),
             "refund R after a refused resolve naming another attempt")
    p = resolve(s, rid, named["id"], "--force", "--json")
    check_eq(p.returncode, 0, "exit status of the forced resolve: %s" % p.stderr.decode())
    out = json.loads(p.stdout.decode())
    check_eq((out["evidence"]["forced"], out["evidence"]["provider_payment_intent"]),
             (True, pi_a), "the forced resolution's evidence")
    check_eq(books(s, rid, a["payment_attempt_id"]),
             ("SUCCEEDED", True, named["id"], AMOUNT, [(named["id"], pi_a, AMOUNT)]),
             "refund R booked with the refund on A's intent")
    on_ledger = {r["provider_refund_id"]: r for r in s.psp_get("/ledger")["refunds"]}
    check_eq(on_ledger[named["id"]]["payment_intent_id"], pi_a,
             "psp-sim's ledger: the booked refund is on A's intent")


if __name__ == "__main__":
    raise SystemExit(e2e.main(scenario))
