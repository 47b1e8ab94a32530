"""charged api, POST /v1/webhooks/provider, against real PostgreSQL:

- refused deliveries (forged, stale, future, tampered, missing or malformed
  signature; bad JSON or shape; oversized) get 400 or 413 and leave nothing
  behind;
- a body over the limit is answered 413 that the client can read, however
  it is sent (2 MB at once, just over the limit slowly, chunked), and the
  api serves the next delivery;
- a delivery signed with the old secret during a rotation is accepted;
- three concurrent deliveries of one event give one transition, one outbox
  event and one ledger row;
- the state rules: success settles UNKNOWN and PROCESSING (even one a worker
  holds a lease on), failure settles them FAILED, processing moves UNKNOWN,
  a contradiction of a final state goes to REQUIRES_REVIEW, older evidence
  is recorded and ignored, an unknown attempt's event is stored for review;
- refund events, delivered concurrently, again and out of order, move a
  refund once each way (one transition, one result event, the money by the
  trigger), a charge.refunded applies each refund it lists, a failure of a
  SUCCEEDED refund is needs_review and never applied, an unknown refund's
  event is stored unmatched.
"""

import http.client
import json
import socket
import threading
import time

import charged_api as api
import charged_e2e as e2e
from charged_e2e import check, check_eq


def nothing_behind(s, a, what):
    check_eq(api.webhook_rows(s), {}, "stored webhook events after " + what)
    c = api.counts(s, a["id"])
    check_eq((c["transitions"], c["outbox"], c["ledger"], c["status"]),
             (0, 0, 0, a["status"]), "attempt after " + what)


def refused(s, port):
    a = api.insert_attempt(s, "UNKNOWN", ppid="pi_refused_0001")
    body = json.dumps(api.event("succeeded", a)).encode()
    now = int(time.time())
    cases = [
        ("forged", api.sign(body, "whsec_someone_else_entirely")),
        ("stale", api.sign(body, t=now - 305)),  # past the edge, whatever second the server reads
        ("future", api.sign(body, t=now + 305)),
        ("missing", None),
        ("empty", ""),
        ("malformed", "t=abc,v1=zz"),
        ("no v1", "t=%d" % now),
        ("v0 only", "t=%d,v0=%s" % (now, "0" * 64)),
    ]
    for what, header in cases:
        st, doc = api.post_webhook(port, body, header=header)
        check_eq(st, 400, "status of a %s signature" % what)
        check(doc and "error" in doc, "error answer of a %s signature: %r" % (what, doc))
        nothing_behind(s, a, what + " signature")
    # Tampered: signed, then one byte of the body changed.
    header = api.sign(body)
    tampered = body.replace(b'"amount": %d' % a["amount"], b'"amount": %d' % (a["amount"] + 1))
    check(tampered != body, "tampering changed the body")
    check_eq(api.post_webhook(port, tampered, header=header)[0], 400, "tampered body")
    nothing_behind(s, a, "tampered body")
    # Well signed, but not an event we can read.
    for what, raw in [("not json", b"{not json"), ("array", b"[]"),
                      ("no id", json.dumps({"type": "payment_intent.succeeded"}).encode()),
                      ("bad utf-8", b'{"id":"evt_1","type":"x\xc3"}'),
                      ("nul escape", b'{"id":"evt_\\u0000","type":"payment_intent.succeeded"}'),
                      ("type disagrees", json.dumps(dict(api.event("succeeded", a), type="payment_intent.processing")).encode()),
                      ("empty", b"")]:
        st, doc = api.post_webhook(port, raw)
        check_eq(st, 400, "status of a signed body that is %s" % what)
        nothing_behind(s, a, "a signed body that is " + what)
    # Larger than API_MAX_BODY_BYTES (set to 4096 below): 413, with or
    # without a Content-Length the server can see first.
    big = json.dumps(dict(api.event("succeeded", a), pad="x" * 5000)).encode()
    check_eq(api.post_webhook(port, big)[0], 413, "oversized body")
    nothing_behind(s, a, "an oversized body")
    return a


def raw_post(port, body, chunked=False, pieces=1, pause=0.0, expect=False, may_cut=False):
    """POSTs body over a plain socket in `pieces` writes `pause` seconds
    apart (chunked transfer coding if asked) and reads the answer as a
    client would: (status, JSON answer). A reset while sending or before
    the answer could be read fails the check, unless may_cut: then it is
    ("cut", None)."""
    head = ["POST /v1/webhooks/provider HTTP/1.1", "Host: 127.0.0.1",
            "Content-Type: application/json", "Stripe-Signature: " + api.sign(body)]
    head.append("Transfer-Encoding: chunked" if chunked else "Content-Length: %d" % len(body))
    if expect:
        head.append("Expect: 100-continue")
    step = -(-len(body) // pieces)
    parts = [body[i:i + step] for i in range(0, len(body), step)]
    with socket.create_connection(("127.0.0.1", port), timeout=e2e.scaled(20)) as c:
        try:
            c.sendall(("\r\n".join(head) + "\r\n\r\n").encode())
            if expect:
                # A client that asked first sends nothing before the answer.
                parts = []
            for i, part in enumerate(parts):
                if i and pause:
                    time.sleep(pause)  # a slow client, on purpose
                c.sendall(b"%x\r\n%s\r\n" % (len(part), part) if chunked else part)
            if chunked and not expect:
                c.sendall(b"0\r\n\r\n")
            r = http.client.HTTPResponse(c)
            r.begin()
            raw = r.read()
        except (OSError, http.client.HTTPException) as err:
            if may_cut:
                return "cut", None
            raise e2e.Failure("the api cut a %d-byte %s body off instead of answering it: %r"
                              % (len(body), "chunked" if chunked else "counted", err))
    return r.status, json.loads(raw) if raw else None


def oversized(s, port):
    """A body over API_MAX_BODY_BYTES (4096 here) gets a 413 the client can
    read, not a reset: the api reads the rest and throws it away."""
    a = api.insert_attempt(s, "UNKNOWN", ppid="pi_oversized_0001")
    ev = api.event("succeeded", a)
    huge = json.dumps(dict(ev, pad="x" * (2 * 1024 * 1024))).encode()
    just_over = json.dumps(ev).encode()
    just_over = json.dumps(dict(ev, pad="x" * (4097 - len(just_over) - 11))).encode()
    check_eq(len(just_over), 4097, "length of the just-over body")
    for what, kw in [("2 MB at once", dict(body=huge)),
                     ("2 MB chunked", dict(body=huge, chunked=True, pieces=64)),
                     ("4097 bytes slowly", dict(body=just_over, pieces=8, pause=0.05)),
                     ("4097 bytes chunked slowly", dict(body=just_over, chunked=True,
                                                       pieces=8, pause=0.05)),
                     ("2 MB announced with Expect: 100-continue",
                      dict(body=huge, expect=True))]:
        st, doc = raw_post(port, **kw)
        check_eq(st, 413, "status of an oversized body, " + what)
        check(doc and "error" in doc, "error answer of an oversized body, %s: %r" % (what, doc))
        nothing_behind(s, a, "an oversized body, " + what)
    # More than 8 MiB past the limit is not worth reading: a chunked body
    # that long is cut off, and nothing is stored.
    st, _ = raw_post(port, huge * 5, chunked=True, pieces=80, may_cut=True)
    check_eq(st, "cut", "answer to a chunked body 10 MB over the limit")
    nothing_behind(s, a, "a chunked body 10 MB over the limit")
    st, doc = api.post_webhook(port, ev)
    check_eq((st, doc and doc.get("result")), (200, "applied"),
             "a delivery after the oversized bodies")


def rotation(s, port):
    a = api.insert_attempt(s, "UNKNOWN", ppid="pi_rotation_0001")
    ev = api.event("succeeded", a)
    st, doc = api.post_webhook(port, ev, secret=api.OLD_SECRET)
    check_eq(st, 200, "delivery signed with the old secret during a rotation")
    check_eq(api.counts(s, a["id"])["status"], "SUCCEEDED", "attempt after the old-secret delivery")
    # Both values in one header, as the provider sends during its own rotation.
    b = api.insert_attempt(s, "UNKNOWN", ppid="pi_rotation_0002")
    body = json.dumps(api.event("succeeded", b)).encode()
    t = int(time.time())
    two = "t=%d,v1=%s,v1=%s" % (t, api.sign(body, "whsec_not_ours_at_all", t).split("v1=")[1],
                                api.sign(body, api.SECRET, t).split("v1=")[1])
    check_eq(api.post_webhook(port, body, header=two)[0], 200, "header with two v1 values")


def concurrent(s, port):
    a = api.insert_attempt(s, "UNKNOWN", ppid="pi_concurrent_0001")
    body = json.dumps(api.event("succeeded", a)).encode()
    header = api.sign(body)
    results = []
    start = threading.Barrier(3)

    def send():
        start.wait()
        results.append(api.post_webhook(port, body, header=header))
    threads = [threading.Thread(target=send) for _ in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    check_eq(sorted(r[0] for r in results), [200, 200, 200], "statuses of 3 concurrent deliveries")
    check_eq(sorted(r[1]["result"] for r in results), ["applied", "duplicate", "duplicate"],
             "results of 3 concurrent deliveries")
    c = api.counts(s, a["id"])
    check_eq((c["status"], c["transitions"], c["outbox"], c["ledger"]), ("SUCCEEDED", 1, 1, 1),
             "attempt after 3 concurrent deliveries")
    # And again later: a duplicate has no side effect.
    check_eq(api.post_webhook(port, body)[1]["result"], "duplicate", "a late redelivery")
    check_eq(api.counts(s, a["id"]), c, "attempt after a late redelivery")


def rules(s, port):
    def send(ev, want_result, what):
        st, doc = api.post_webhook(port, ev)
        check_eq(st, 200, "status: " + what)
        check_eq(doc["result"], want_result, "result: " + what)

    def status(a):
        return api.counts(s, a["id"])["status"]

    # An intent that only names the attempt (none recorded: the worker's
    # answer is not in) never moves it (issue 34): a success is unproven (no
    # page: the provider's webhook often outruns our own answer), a failure
    # ignored, and an UNKNOWN attempt is due for the reconciler now.
    n = api.insert_attempt(s, "PROCESSING", lease_owner="some-worker")
    send(api.event("succeeded", n, intent="pi_names_0001"), "unproven",
         "success naming a PROCESSING")
    send(api.event("payment_failed", n, intent="pi_names_0002"), "ignored",
         "failure naming a PROCESSING")
    check_eq(status(n), "PROCESSING", "PROCESSING after events that only name it")
    un = api.insert_attempt(s, "UNKNOWN")
    s.query("UPDATE payment_attempts SET next_check_at = now() + interval '1 hour'"
            " WHERE id = '%s'" % un["id"])
    send(api.event("payment_failed", un, intent="pi_names_0003"), "ignored",
         "failure naming an UNKNOWN")
    check_eq(s.query("SELECT status, next_check_at <= now() FROM payment_attempts"
                     " WHERE id = '%s'" % un["id"]), [["UNKNOWN", "t"]],
             "UNKNOWN after a failure that only names it: due for the reconciler")
    check_eq(s.query("SELECT reason FROM processed_webhook_events WHERE"
                     " payload->'data'->'object'->>'id' = 'pi_names_0003'"),
             [["about an intent that only names the attempt"]], "the event's recorded reason")

    # Success settles PROCESSING held by a worker's lease (its intent
    # recorded, the provider said processing): the worker is fenced.
    p = api.insert_attempt(s, "PROCESSING", lease_owner="some-worker", ppid="pi_leased_0001")
    send(api.event("succeeded", p, intent="pi_leased_0001"), "applied", "success for a leased PROCESSING")
    row = s.query("SELECT status, provider_payment_id, coalesce(lease_owner, '') FROM payment_attempts "
                  "WHERE id = '%s'" % p["id"])[0]
    check_eq(row, ["SUCCEEDED", "pi_leased_0001", ""], "leased attempt after success")
    ev = s.query("SELECT event_type, payload->>'provider_payment_id' FROM outbox "
                 "WHERE payment_attempt_id = '%s'" % p["id"])
    check_eq(ev, [["charge.succeeded", "pi_leased_0001"]], "result event of the success")
    cause = s.query("SELECT cause, old_status, new_status FROM attempt_transitions "
                    "WHERE payment_attempt_id = '%s'" % p["id"])
    check_eq(cause, [["webhook", "PROCESSING", "SUCCEEDED"]], "transition of the success")

    # Failure settles UNKNOWN as FAILED, with the decline code as reason.
    f = api.insert_attempt(s, "UNKNOWN", ppid="pi_failed_0001")
    send(api.event("payment_failed", f), "applied", "failure for UNKNOWN")
    check_eq(status(f), "FAILED", "UNKNOWN after a failure event")
    check(s.query("SELECT reason FROM payment_attempts WHERE id = '%s'" % f["id"])[0][0]
          .startswith("declined: insufficient_funds"), "reason of the webhook failure")
    check_eq(api.counts(s, f["id"])["ledger"], 0, "ledger rows of a failure")

    # Processing moves UNKNOWN to PROCESSING (no lease, for the reconciler).
    u = api.insert_attempt(s, "UNKNOWN", ppid="pi_proc_0001")
    send(api.event("processing", u), "applied", "processing for UNKNOWN")
    check_eq(status(u), "PROCESSING", "UNKNOWN after a processing event")

    # Older evidence is recorded and ignored: processing after succeeded.
    ok = api.insert_attempt(s, "SUCCEEDED")
    send(api.event("processing", ok, created=int(time.time()) - 60), "ignored", "processing after success")
    check_eq(status(ok), "SUCCEEDED", "SUCCEEDED after a stale processing event")
    # A failure dated before the success is older too.
    send(api.event("payment_failed", ok, created=int(time.time()) - 60), "ignored", "old failure after success")
    check_eq(status(ok), "SUCCEEDED", "SUCCEEDED after an older failure")

    # Contradictions of a final state go to review, never flip it.
    failed = api.insert_attempt(s, "FAILED", ppid="pi_contra_0001", reason="declined: x")
    send(api.event("succeeded", failed), "review", "success for FAILED")
    check_eq(status(failed), "REQUIRES_REVIEW", "FAILED after a success event")
    check_eq(api.counts(s, failed["id"])["ledger"], 0, "ledger rows of a contradiction")
    check_eq(s.query("SELECT event_type FROM outbox WHERE payment_attempt_id = '%s'" % failed["id"]),
             [["charge.requires_review"]], "result event of the contradiction")
    other = api.insert_attempt(s, "SUCCEEDED")
    # Another intent than the one recorded is another's: flagged, never our
    # attempt's review (issue 34).
    send(api.event("succeeded", other, intent="pi_another_charge"), "flagged", "success of another intent")
    check_eq(status(other), "SUCCEEDED", "SUCCEEDED after another intent's success")
    amount = api.insert_attempt(s, "UNKNOWN", ppid="pi_amount_0001")
    send(api.event("succeeded", amount, amount=amount["amount"] + 100), "review", "success for another amount")
    check_eq(status(amount), "REQUIRES_REVIEW", "UNKNOWN after a success for another amount")
    check_eq(api.counts(s, amount["id"])["ledger"], 0, "ledger rows of another amount")

    # A success the attempt already has: ignored; a REJECTED one: flagged.
    send(api.event("succeeded", ok), "ignored", "the same success again, new event id")
    check_eq(api.counts(s, ok["id"])["transitions"], 0, "transitions of a repeated success")
    rj = api.insert_attempt(s, "REJECTED", reason="order_already_paid: x")
    send(api.event("succeeded", rj, intent="pi_rejected_0001"), "flagged", "success for REJECTED")
    check_eq(status(rj), "REJECTED", "REJECTED after a success event")

    # Unknown attempt: stored for review, not dropped.
    ghost = {"id": "0b5e8d0e-4c1f-4e57-9d0c-6f1b1e2a3c4d", "order_id": "0b5e8d0e-4c1f-4e57-9d0c-000000000000",
             "amount": 500, "currency": "EUR"}
    ev = api.event("succeeded", ghost, intent="pi_ghost_0001")
    send(ev, "unmatched", "event for an unknown attempt")
    row = s.query("SELECT outcome, payment_attempt_id, payload->'data'->'object'->>'id' "
                  "FROM processed_webhook_events WHERE event_id = '%s'" % ev["id"])
    check_eq(row, [["unmatched", ghost["id"], "pi_ghost_0001"]], "stored unmatched event")
    # Other event types are recorded, not acted on.
    other_type = {"id": "evt_charge_refunded_1", "type": "charge.refunded", "created": int(time.time()),
                  "data": {"object": {"id": "ch_1", "object": "charge"}}}
    send(other_type, "ignored", "an event type we do not act on")


def refunds(s, port):
    def send(ev, want, what):
        st, doc = api.post_webhook(port, ev)
        check_eq((st, doc and doc.get("result")), (200, want), what)

    charge = api.insert_attempt(s, "SUCCEEDED", amount=1000)
    # Each refund holds the re_ id its own call's answer gave: only a refund
    # with that id moves it (issue 34).
    r1 = api.insert_refund(s, charge, "PROCESSING", 300, ppid="re_webhook_0001")
    ok = api.refund_event("refund.updated", api.refund_object(r1, "re_webhook_0001", "succeeded"))
    body = json.dumps(ok).encode()
    header = api.sign(body)
    results = []
    start = threading.Barrier(3)

    def deliver():
        start.wait()
        results.append(api.post_webhook(port, body, header=header))
    threads = [threading.Thread(target=deliver) for _ in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    check_eq(sorted((r[0], r[1]["result"]) for r in results),
             [(200, "applied"), (200, "duplicate"), (200, "duplicate")],
             "3 concurrent deliveries of a refund's success")
    check_eq(api.refund_counts(s, r1["id"]), ("SUCCEEDED", "re_webhook_0001", 1, 1),
             "refund after 3 concurrent deliveries")
    check_eq(api.refund_money(s, charge["id"]), (300, 300, 1), "the charge's refund money")
    check_eq(s.query("SELECT event_type FROM outbox WHERE refund_id = '%s'" % r1["id"]),
             [["refund.succeeded"]], "the refund's result event")
    # Reordered: the created (pending) event arrives after the success, the
    # success again under a new event id, found by the provider's id only.
    send(api.refund_event("refund.created", api.refund_object(r1, "re_webhook_0001", "pending")),
         "ignored", "a pending refund after its success")
    send(api.refund_event("refund.updated", api.refund_object(
        r1, "re_webhook_0001", "succeeded", with_metadata=False)),
         "ignored", "the success again, without metadata")
    check_eq(api.refund_counts(s, r1["id"]), ("SUCCEEDED", "re_webhook_0001", 1, 1),
             "refund after late and repeated events")
    # The provider fails a SUCCEEDED refund: a person looks, nothing moves.
    send(api.refund_event("refund.failed", api.refund_object(
        r1, "re_webhook_0001", "failed", failure_reason="expired_or_canceled_card")),
         "needs_review", "failure of a SUCCEEDED refund")
    check_eq(api.refund_counts(s, r1["id"]), ("SUCCEEDED", "re_webhook_0001", 1, 1),
             "SUCCEEDED refund after a failure event")
    check_eq(api.refund_money(s, charge["id"]), (300, 300, 1), "money after a failure event")
    # charge.refunded lists the succeeded one and an UNKNOWN one that failed.
    r2 = api.insert_refund(s, charge, "UNKNOWN", 200, ppid="re_webhook_0002")
    check_eq(api.refund_money(s, charge["id"]), (500, 300, 1), "money with r2 reserved")
    send(api.refund_event("charge.refunded", [
        api.refund_object(r1, "re_webhook_0001", "succeeded"),
        api.refund_object(r2, "re_webhook_0002", "failed", failure_reason="lost_or_stolen_card")]),
         "applied", "charge.refunded of two refunds")
    check_eq(api.refund_counts(s, r2["id"]), ("FAILED", "re_webhook_0002", 1, 1),
             "the failed refund of charge.refunded")
    check_eq(s.query("SELECT reason FROM refund_attempts WHERE id = '%s'" % r2["id"]),
             [["refund failed: lost_or_stolen_card"]], "the failed refund's reason")
    check_eq(api.refund_money(s, charge["id"]), (300, 300, 1), "money after r2 failed")
    check_eq(api.refund_counts(s, r1["id"])[2:], (1, 1), "r1 untouched by charge.refunded")
    # An UNKNOWN refund told pending goes PROCESSING (no event for that).
    r3 = api.insert_refund(s, charge, "UNKNOWN", 100, ppid="re_webhook_0003")
    send(api.refund_event("refund.updated", api.refund_object(r3, "re_webhook_0003", "pending")),
         "applied", "pending for an UNKNOWN refund")
    check_eq(api.refund_counts(s, r3["id"]), ("PROCESSING", "re_webhook_0003", 1, 0),
             "UNKNOWN refund after pending")
    # A refund that only names ours (its answer lost: no re_ id recorded):
    # never moved, its reservation kept, due for the reconciler now.
    r4 = api.insert_refund(s, charge, "UNKNOWN", 50)
    s.query("UPDATE refund_attempts SET next_check_at = now() + interval '1 hour'"
            " WHERE id = '%s'" % r4["id"])
    send(api.refund_event("refund.failed", api.refund_object(
        r4, "re_names_0004", "failed", failure_reason="lost_or_stolen_card")),
         "ignored", "failure of a refund that only names an UNKNOWN refund")
    send(api.refund_event("refund.updated", api.refund_object(r4, "re_names_0005", "succeeded")),
         "unproven", "success of a refund that only names an UNKNOWN refund")
    check_eq(s.query("SELECT status, coalesce(provider_refund_id, ''), next_check_at <= now()"
                     " FROM refund_attempts WHERE id = '%s'" % r4["id"]),
             [["UNKNOWN", "", "t"]], "the UNKNOWN refund after refunds naming it")
    check_eq(api.refund_money(s, charge["id"])[:2], (450, 300),
             "money: r4's reservation kept")
    # A refund we do not know: stored for review.
    ghost = dict(r1, id="0b5e8d0e-4c1f-4e57-9d0c-6f1b1e2a3c4e")
    ev = api.refund_event("refund.updated", api.refund_object(ghost, "re_webhook_ghost", "succeeded"))
    send(ev, "unmatched", "an event for an unknown refund")
    check_eq(api.webhook_rows(s).get(ev["id"]), "unmatched", "the stored unknown refund event")
    # refund.failed whose refund is not failed is a bad request.
    bad = api.refund_event("refund.failed", api.refund_object(r3, "re_webhook_0003", "pending"))
    check_eq(api.post_webhook(port, bad)[0], 400, "refund.failed of a pending refund")


def regressions(s, port):
    """Breaks an outside review proved, each kept here."""
    def send(ev, want, what):
        st, doc = api.post_webhook(port, ev)
        check_eq((st, doc and doc.get("result")), (200, want), what)

    def status(a):
        return api.counts(s, a["id"])["status"]

    # A success for a FAILED attempt whose order a retry has since paid: it
    # cannot become REQUIRES_REVIEW beside the paid attempt (one live
    # attempt per order), but the evidence must be stored, not 503'd.
    failed = api.insert_attempt(s, "FAILED", ppid="pi_first_try_0001", reason="declined: x")
    api.insert_attempt(s, "SUCCEEDED", order_id=failed["order_id"])
    ev = api.event("succeeded", failed)
    send(ev, "flagged", "success for a FAILED attempt of a paid order")
    check_eq(status(failed), "FAILED", "the FAILED attempt of a paid order")
    check_eq(api.webhook_rows(s).get(ev["id"]), "flagged", "the stored evidence")

    # A number PostgreSQL's jsonb refuses (an underflow jansson accepts):
    # stored as re-written, not a 503 loop.
    a = api.insert_attempt(s, "UNKNOWN", ppid="pi_underflow_0001")
    body = json.dumps(api.event("succeeded", a)).replace('"livemode"', '"risk": 1e-20000, "livemode"')
    send(body.encode(), "applied", "an event with 1e-20000 in it")

    # A long intent id (up to 255 characters) compares whole.
    long_id = "pi_" + "A" * 200
    b = api.insert_attempt(s, "UNKNOWN", ppid=long_id)
    send(api.event("succeeded", b), "applied", "success with a 203-character intent id")
    send(api.event("succeeded", b), "ignored", "the same success again, new event id")
    check_eq(status(b), "SUCCEEDED", "attempt with a long intent id")

    # Metadata names attempt A, the intent is B's: not A's money.
    owner = api.insert_attempt(s, "PROCESSING", ppid="pi_belongs_to_b", reason="provider_processing")
    named = api.insert_attempt(s, "UNKNOWN")
    send(api.event("succeeded", named, intent="pi_belongs_to_b"), "flagged",
         "success naming A with B's intent")
    check_eq(status(named), "UNKNOWN", "A after B's intent's success")
    check_eq(api.counts(s, named["id"])["ledger"], 0, "ledger rows of A")
    send(api.event("succeeded", owner), "applied", "B's own success")
    check_eq(api.counts(s, owner["id"])["ledger"], 1, "ledger rows of B")
    u = api.insert_attempt(s, "UNKNOWN")
    send(api.event("payment_failed", u, intent="pi_belongs_to_b"), "ignored",
         "failure naming A with B's intent")
    check_eq(status(u), "UNKNOWN", "A after a failure of B's intent")

    # A success must name a real amount.
    neg = api.insert_attempt(s, "UNKNOWN", ppid="pi_negative_0001")
    check_eq(api.post_webhook(port, api.event("succeeded", neg, amount=-1))[0], 400,
             "success with a negative amount")
    check_eq(status(neg), "UNKNOWN", "attempt after a negative amount")

    # A failure dated in the second after the success was stored is newer.
    ok = api.insert_attempt(s, "SUCCEEDED")
    s.psql(s.db, "UPDATE payment_attempts SET updated_at = to_timestamp(1900000000.6) "
           "WHERE id = '%s'" % ok["id"])
    send(api.event("payment_failed", ok, created=1900000001), "review",
         "failure dated 0.4 s after the success")

    # Card digits and invisible characters from the provider never reach a
    # reason, an answer or an event.
    f = api.insert_attempt(s, "UNKNOWN", ppid="pi_card_text_0001")
    send(api.event("payment_failed", f, decline_code="card_4242424242424242_\u202e_x"),
         "applied", "failure with card digits in its decline code")
    reason = s.query("SELECT reason FROM payment_attempts WHERE id = '%s'" % f["id"])[0][0]
    check("4242424242424242" not in reason and "\u202e" not in reason, "reason %r" % reason)
    raw = api.request(port, "GET", "/v1/payment-attempts/%s" % f["id"])[2].decode()
    check("4242424242424242" not in raw, "card digits in a status answer")
    stored = s.query("SELECT payload::text FROM processed_webhook_events WHERE "
                     "payment_attempt_id = '%s'" % f["id"])[0][0]
    check("4242424242424242" not in stored, "card digits in the stored event")

    # Paths and methods.
    check_eq(api.get(port, "/v1/orders/0123456789%s" % f["id"])[0], 404, "an attempt under /v1/orders")
    st, _, _ = api.request(port, "GET", "/v1/webhooks/provider")
    check_eq(st, 405, "GET of the webhook endpoint")


def scenario(make):
    s = make("api_webhooks", partitions=1)
    name, port = api.start_api(s, secrets=(api.SECRET, api.OLD_SECRET), API_MAX_BODY_BYTES=4096)
    refused(s, port)
    oversized(s, port)
    rotation(s, port)
    concurrent(s, port)
    rules(s, port)
    refunds(s, port)
    regressions(s, port)
    # Every line of the api's log is JSON, and no secret is in it.
    log = open("%s/%s.log" % (s.dir, name)).read()
    for secret in (api.SECRET, api.OLD_SECRET):
        check(secret not in log, "the api log holds a signing secret")
    for line in log.splitlines():
        json.loads(line)
    check_eq(api.stop_api(s, name), 0, "api exit status on SIGTERM")


if __name__ == "__main__":
    raise SystemExit(e2e.main(scenario))
