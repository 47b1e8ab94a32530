#!/usr/bin/env python3
"""Adversarial scenarios for `charged auditor`: states of the provider's
books and of our own tables that the auditor must survive and judge right.
Each scenario states the property it holds the auditor to; a failure is a
break of the audit's promise (a window never audited, a double charge not
paged, a finding an operator cannot act on).

Scenarios can be run alone: test_auditor_adversary.py long_provider_ids"""
import json
import sys
import time
import uuid

import charged_e2e as e2e
from charged_e2e import check, check_eq

AUDITOR = {"AUDITOR_WINDOW_MS": 2000, "AUDITOR_LAG_MS": 1500, "AUDITOR_POLL_MS": 200}


def db_now(s):
    return float(s.query("SELECT extract(epoch FROM now())")[0][0])


def watermark(s):
    return s.audit_totals()["watermark"]


def wait_watermark(s, past, timeout=60):
    e2e.wait_until("audit watermark past %d" % past, lambda: watermark(s) > past, timeout)


def findings(s):
    rows = s.query("SELECT kind, object_id, coalesce(payment_attempt_id, ''),"
                   " coalesce(order_id, ''), coalesce(other_object_id, '')"
                   " FROM audit_findings ORDER BY id")
    return [dict(zip(("kind", "object", "attempt", "order", "other"), r)) for r in rows]


def inject(s, **body):
    return s.psp_put("/inject/intents", body, method="POST")["ids"]


def long_provider_ids(new):
    """Stripe's object ids may be up to 255 characters, and psp-sim makes
    such ids. One intent with a long id that ends a page of the list must
    not stop the audit of its window (and so of every later window: the
    watermark never moves again), and a finding must name the object as the
    provider does, or an operator cannot look it up."""
    s = new("adv_longid")
    t = int(db_now(s)) - 20
    long_id = "pi_" + "L" * 200
    # Newest first, by created then by creation: the 99 at t+1 come first,
    # then the long one (made after `first`), which ends page one.
    first = inject(s, created=t, amount=11)[0]
    inject(s, id=long_id, created=t, amount=12)
    rest = inject(s, count=99, id="pi_adv{n}", created=t + 1, amount=13)
    au = s.start_auditor(AUDITOR_FROM=t, **AUDITOR)
    try:
        wait_watermark(s, t + 2, timeout=e2e.scaled(20))
    except e2e.Failure:
        log = open("%s/%s.log" % (s.dir, au)).read()
        check(False, "the window holding a %d-character intent id was never audited;"
              " watermark %d, auditor says: %s" % (len(long_id), watermark(s),
                                                  [l for l in log.splitlines()
                                                   if "not audited" in l][-1:]))
    got = {f["object"] for f in findings(s) if f["kind"] == "unknown_intent"}
    check(long_id in got, "unknown_intent names the long id as the provider does: %s"
          % sorted(x for x in got if x.startswith("pi_L")))
    check_eq(len(got), 101, "unknown intents found")
    check_eq(s.stop_auditor(au), 0, "the auditor's exit after SIGTERM")


def runaway_order(new):
    """A broken integration's retry loop makes thousands of charges for one
    order, each under its own attempt id: every one after the first is
    charged_twice. The audit of that window must stay streaming-fast (the
    contract: 100,000 intents within a bulk window), not cost a scan of the
    order's every intent per intent, which never lets the watermark move."""
    n = 6000
    s = new("adv_runaway")
    at = int(db_now(s)) - 20
    order = str(uuid.uuid4())
    inject(s, count=n, id="pi_run{n}", created=at, amount=500,
           metadata={"payment_attempt_id": "00000000-0000-4000-8000-{n}", "order_id": order})
    t0 = time.monotonic()
    au = s.start_auditor(AUDITOR_FROM=at, **AUDITOR)
    budget = 30
    e2e.wait_until("the window of %d charges of one order audited" % n,
                   lambda: watermark(s) > at + 1, budget)
    took = time.monotonic() - t0
    e2e.log("runaway: %d intents of one order audited in %.1fs" % (n, took))
    got = s.query("SELECT kind, count(*) FROM audit_findings GROUP BY kind")
    kinds = dict((k, int(c)) for k, c in got)
    check_eq(sum(kinds.values()), n, "findings of the runaway order, one per intent")
    check(kinds.get("charged_twice", 0) >= n - 1,
          "charged_twice of the runaway order's %d intents: %s" % (n, kinds))
    check_eq(s.stop_auditor(au), 0, "the auditor's exit after SIGTERM")


def twins_across_pages(new):
    """Two succeeded intents for one attempt, neither booked: charged_twice,
    whatever else the window holds. The list is newest first, so when the
    twins fall on two pages the newer one is judged before the older is
    copied; the older one must still be seen as the second charge."""
    s = new("adv_twins")
    at = int(db_now(s)) - 20
    attempt, order = str(uuid.uuid4()), str(uuid.uuid4())
    md = {"payment_attempt_id": attempt, "order_id": order}
    older = inject(s, created=at, amount=700, metadata=md)[0]
    inject(s, count=99, id="pi_fill{n}", created=at, amount=1)
    newer = inject(s, created=at + 1, amount=700, metadata=md)[0]
    au = s.start_auditor(AUDITOR_FROM=at, **AUDITOR)
    wait_watermark(s, at + 1)
    got = {f["object"]: f["kind"] for f in findings(s) if f["object"] in (older, newer)}
    e2e.log("twins: %s" % got)
    check("charged_twice" in got.values(),
          "two succeeded intents of attempt %s on two pages of one window: %s"
          % (attempt, got))
    check_eq(s.stop_auditor(au), 0, "the auditor's exit after SIGTERM")


def on_demand_first(new):
    """An operator's `chargectl audit run` finds a charge first; the
    scheduled audit of that window then finds it again. The window's
    verdict counts it, so `chargectl audit show` of that window must list
    it (the ids to act on), and the auditor's finding counter, which the
    page is made of, must count it: a finding is not less of a double
    charge for having been seen once by hand."""
    s = new("adv_ondemand")
    at = int(db_now(s)) - 20
    stray = inject(s, created=at, amount=990,
                   metadata={"payment_attempt_id": str(uuid.uuid4())})[0]
    rc, out, err = s.audit("run", "--since", "%ds" % (int(db_now(s)) - at + 2), "--json")
    check_eq(rc, 1, "chargectl audit run over the stray charge (%s)" % err)
    au = s.start_auditor(AUDITOR_FROM=at, **AUDITOR)
    wait_watermark(s, at + 1)
    wid, found = s.query("SELECT id, findings->>'charged_unbooked' FROM audit_windows"
                         " WHERE scheduled AND window_start <= to_timestamp(%d)"
                         " AND window_end > to_timestamp(%d)" % (at, at))[0]
    check_eq(found, "1", "charged_unbooked in the scheduled verdict")
    problems = []
    rc, out, _ = s.audit("show", wid, "--json")
    rows = json.loads(out)["finding_rows"] if rc == 0 else None
    if not rows or stray not in [r["object_id"] for r in rows]:
        problems.append("audit show %s (charged_unbooked=1) lists %r" % (wid, rows))
    m = s.admin_metrics(au)
    if m.get('charged_audit_findings_total{kind="charged_unbooked"}', 0) < 1:
        problems.append("the auditor's counter of charged_unbooked: %s" % {
            k: v for k, v in m.items() if k.startswith("charged_audit_findings")})
    check(not problems, "; ".join(problems))
    check_eq(s.stop_auditor(au), 0, "the auditor's exit after SIGTERM")


def paid_order(s, at, amount=1000):
    """A SUCCEEDED attempt booked on an intent psp-sim holds, made at `at`:
    (attempt id, order id, intent id)."""
    attempt, order = str(uuid.uuid4()), str(uuid.uuid4())
    pi = inject(s, created=at, amount=amount,
                metadata={"payment_attempt_id": attempt, "order_id": order})[0]
    s.psql(s.db, """
        INSERT INTO payment_attempts (id, order_id, idempotency_key, request_fingerprint,
            amount, currency, payment_method, status, provider_payment_id, created_at)
        VALUES ('%s', '%s', 'adv-%s', 'fp', %d, 'USD', 'pm_card_visa', 'SUCCEEDED', '%s',
            to_timestamp(%d));
        INSERT INTO ledger_entries (payment_attempt_id, order_id, kind, amount, currency,
            provider_payment_id, created_at)
        VALUES ('%s', '%s', 'charge', %d, 'USD', '%s', to_timestamp(%d));
        """ % (attempt, order, attempt, amount, pi, at, attempt, order, amount, pi, at))
    return attempt, order, pi


def second_charge_by_order_only(new):
    """A second succeeded intent for an order already paid, whose metadata
    names the order but no attempt (an integration that tags charges with
    the order alone, or a dashboard charge copied from the order): that is
    the promise broken, charged_twice, which pages, not unknown_intent,
    which only opens a ticket."""
    s = new("adv_orderonly")
    at = int(db_now(s)) - 20
    attempt, order, pi = paid_order(s, at)
    second = inject(s, created=at + 1, amount=1000, metadata={"order_id": order})[0]
    au = s.start_auditor(AUDITOR_FROM=at, **AUDITOR)
    wait_watermark(s, at + 1)
    got = {f["object"]: (f["kind"], f["other"]) for f in findings(s)}
    check_eq(got.get(pi), None, "findings of the booked intent")
    check_eq(got.get(second), ("charged_twice", pi),
             "the second charge of order %s (kind, other)" % order)
    check_eq(s.stop_auditor(au), 0, "the auditor's exit after SIGTERM")


def stuck_cursor(new):
    """A provider (or a proxy in front of it) that ignores starting_after
    answers the same page with has_more true forever. The audit must not
    walk it forever, counting the same objects as if new and never reaching
    another window: a cursor that does not move is no evidence."""
    import http.server
    import threading
    s = new("adv_cursor")
    at = int(db_now(s)) - 20

    class Stuck(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            page = {"object": "list", "has_more": "payment_intents" in self.path,
                    "data": [{"id": "pi_stuck", "object": "payment_intent",
                              "status": "canceled", "amount": 1, "currency": "usd",
                              "created": at, "metadata": {}}]
                    if "payment_intents" in self.path else []}
            body = json.dumps(page).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *a):
            pass
    srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Stuck)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    try:
        au = s.start_auditor(AUDITOR_FROM=at, PROVIDER_BASE_URL="http://127.0.0.1:%d"
                             % srv.server_address[1], **AUDITOR)

        def gave_up():
            return "window not audited" in open("%s/%s.log" % (s.dir, au)).read()
        try:
            e2e.wait_until("the auditor gives the stuck list up", gave_up, 15)
        except e2e.Failure:
            m = s.admin_metrics(au)
            check(False, "the list's cursor never moves, yet the auditor walks on: %s"
                  " objects audited, watermark %d"
                  % (m.get('charged_audit_objects_total{object="intent"}'), watermark(s)))
        check_eq(watermark(s), 0, "windows recorded on a stuck list")
        check_eq(s.stop_auditor(au), 0, "the auditor's exit after SIGTERM")
    finally:
        srv.shutdown()


def booked_refund_fails(new):
    """A refund booked SUCCEEDED while the provider still has it pending (a
    forced `chargectl refund resolve`: the operator saw it in the dashboard),
    which the provider then fails: the ledger holds money given back that
    never went back. The window's audit finds it pending and looks again;
    the look that finds it failed must say booked_not_charged, as it does
    of a booked intent that is not succeeded, not take "failed, no money
    moved" for a match and drop it from the pending list."""
    s = new("adv_refund_fails")
    t0 = int(db_now(s)) - 1
    s.start_worker(WORKER_UNKNOWN_RETRIES=0)
    charge = e2e.new_command(amount=2000)
    s.publish([charge])
    s.wait_settled(1, timeout=e2e.scaled(60))
    pi = s.query("SELECT provider_payment_id FROM payment_attempts WHERE id = '%s'"
                 % charge["payment_attempt_id"])[0][0]
    refund = e2e.new_refund(charge, 1000)
    rid = refund["refund_id"]
    s.psp_put("/faults", {"rules": [{"kind": "error_before", "probability": 1,
                                     "key": refund["idempotency_key"]}]})
    s.publish([refund])
    e2e.wait_until("refund %s UNKNOWN" % rid, lambda: s.query(
        "SELECT status FROM refund_attempts WHERE id = '%s'" % rid) == [["UNKNOWN"]],
        e2e.scaled(30))
    s.psp_put("/faults", {"rules": []}, method="DELETE")
    re_id = s.psp_put("/inject/refunds", {"payment_intent": pi, "amount": 1000,
                                          "status": "pending",
                                          "metadata": {"refund_id": rid}},
                      method="POST")["id"]
    p = s.run([e2e.CHARGECTL, "refund", "resolve", rid, "--status", "SUCCEEDED",
               "--provider-refund-id", re_id, "--reason", "seen in the dashboard",
               "--force"], check=False)
    check_eq(p.returncode, 0, "the forced resolve (%s)" % p.stderr.decode().strip())
    check_eq(s.query("SELECT count(*) FROM ledger_entries WHERE kind = 'refund'"
                     " AND provider_refund_id = '%s'" % re_id), [["1"]],
             "ledger rows of refund %s" % re_id)
    au = s.start_auditor(AUDITOR_FROM=t0, **AUDITOR)
    wait_watermark(s, int(db_now(s)) + 1, timeout=e2e.scaled(30))
    check_eq(s.query("SELECT object_kind FROM audit_pending WHERE object_id = '%s'"
                     % re_id), [["refund"]], "refund %s pending at the provider" % re_id)
    s.psp_put("/refunds/%s/settle" % re_id, {"status": "failed"}, method="POST")

    def kinds():
        return [r[0] for r in s.query("SELECT kind FROM audit_findings"
                                      " WHERE object_id = '%s'" % re_id)]
    try:
        e2e.wait_until("booked_not_charged of refund %s" % re_id,
                       lambda: "booked_not_charged" in kinds(), e2e.scaled(10))
    except e2e.Failure:
        check(False, "refund %s is booked SUCCEEDED for refund %s, and failed at the"
              " provider: findings %s, still pending: %s" % (
                  re_id, rid, kinds(), s.query("SELECT count(*) FROM audit_pending"
                                               " WHERE object_id = '%s'" % re_id)))
    check_eq(s.stop_auditor(au), 0, "the auditor's exit after SIGTERM")


def booked_intent_gone(new):
    """A charge booked on an intent the provider still has processing (a
    forced resolve, or a row written by hand) is looked at again until it
    settles. When the provider then no longer has the intent at all, the
    look that finds it gone must say booked_not_charged, as the ledger side
    says of a booked object the provider does not have: the ledger side
    already judged the row (pending) and does not look again."""
    s = new("adv_booked_gone")
    at = int(db_now(s)) - 20
    attempt, order = str(uuid.uuid4()), str(uuid.uuid4())
    pi = inject(s, created=at, amount=800, status="processing",
                metadata={"payment_attempt_id": attempt, "order_id": order})[0]
    s.psql(s.db, """
        INSERT INTO payment_attempts (id, order_id, idempotency_key, request_fingerprint,
            amount, currency, payment_method, status, provider_payment_id, created_at)
        VALUES ('%s', '%s', 'adv-%s', 'fp', 800, 'USD', 'pm_card_visa', 'SUCCEEDED', '%s',
            to_timestamp(%d));
        INSERT INTO ledger_entries (payment_attempt_id, order_id, kind, amount, currency,
            provider_payment_id, created_at)
        VALUES ('%s', '%s', 'charge', 800, 'USD', '%s', to_timestamp(%d));
        """ % (attempt, order, attempt, pi, at, attempt, order, pi, at))
    au = s.start_auditor(AUDITOR_FROM=at, **AUDITOR)
    wait_watermark(s, at + 1)
    check_eq(s.query("SELECT object_kind FROM audit_pending WHERE object_id = '%s'" % pi),
             [["intent"]], "booked intent %s pending at the provider" % pi)
    s.psp_put("/intents/%s" % pi, {}, method="DELETE")

    def kinds():
        return [r[0] for r in s.query("SELECT kind FROM audit_findings"
                                      " WHERE object_id = '%s'" % pi)]
    try:
        e2e.wait_until("booked_not_charged of intent %s" % pi,
                       lambda: "booked_not_charged" in kinds(), e2e.scaled(10))
    except e2e.Failure:
        check(False, "intent %s is booked for attempt %s and the provider no longer has"
              " it: findings %s, still pending: %s" % (
                  pi, attempt, kinds(), s.query("SELECT count(*) FROM audit_pending"
                                                " WHERE object_id = '%s'" % pi)))
    got = s.query("SELECT payment_attempt_id, window_start = to_timestamp(%d)"
                  " FROM audit_findings WHERE object_id = '%s'" % (at, pi))
    check_eq(got, [[attempt, "t"]], "the finding's attempt, under the booking's second")
    check_eq(s.stop_auditor(au), 0, "the auditor's exit after SIGTERM")


def legit_flows(new):
    """What charged does on its own must audit clean: a charge that stays
    processing until the reconciler settles it, an order declined and then
    paid by a second attempt, a refund pending at the provider before it
    succeeds, two partial refunds that add up to the charge, a full refund.
    The auditor runs throughout, so it sees the unsettled states first; no
    finding, and nothing left pending once all has settled."""
    # A reconciler that looks at once, so that the wait is the provider's.
    s = new("adv_legit", psp_args=["--processing-settle-ms", "2000",
                                    "--refund-settle-ms", "2000"],
            worker_env={"RECONCILER_FIRST_LOOK_MS": "0"})
    t0 = int(db_now(s)) - 1
    s.start_worker()
    s.start_reconciler(RECONCILER_POLL_MS=100, RECONCILER_SCHEDULE_MS=200)
    au = s.start_auditor(AUDITOR_FROM=t0, **AUDITOR)
    order = str(uuid.uuid4())
    declined = e2e.new_command(order_id=order, payment_method="pm_card_chargeDeclined")
    processing = e2e.new_command(payment_method="pm_card_processing")
    pend = e2e.new_command(payment_method="pm_card_refundPending", amount=5000)
    parts = e2e.new_command(amount=1000)
    whole = e2e.new_command(amount=777)
    s.publish([declined, processing, pend, parts, whole])
    s.wait_settled(5, timeout=e2e.scaled(90))
    retry = e2e.new_command(order_id=order)
    s.publish([retry])
    s.wait_settled(6, timeout=e2e.scaled(60))
    refunds = [e2e.new_refund(pend, 5000), e2e.new_refund(parts, 400),
               e2e.new_refund(parts, 600), e2e.new_refund(whole, 777)]
    s.publish(refunds)
    e2e.wait_until("refunds settled", lambda: int(s.query(
        "SELECT count(*) FROM refund_attempts WHERE status = 'SUCCEEDED'")[0][0]) == 4,
        e2e.scaled(90))
    t1 = int(db_now(s)) + 1
    wait_watermark(s, t1, timeout=e2e.scaled(60))
    e2e.wait_until("nothing pending", lambda: s.query(
        "SELECT count(*) FROM audit_pending")[0][0] == "0", e2e.scaled(60))
    check_eq(findings(s), [], "findings of charged's own flows")
    tot = s.audit_totals()
    psp = s.psp_get("/ledger")
    check_eq((tot["intents"], tot["refunds"]),
             (psp["counters"]["intents"], psp["counters"]["refund_objects"]),
             "intents and refunds audited against psp-sim's")
    check_eq(tot["ledger_rows"], int(s.query("SELECT count(*) FROM ledger_entries")[0][0]),
             "ledger rows audited")
    check_eq(s.stop_auditor(au), 0, "the auditor's exit after SIGTERM")


SCENARIOS = [legit_flows, booked_refund_fails, booked_intent_gone, stuck_cursor, second_charge_by_order_only, on_demand_first, long_provider_ids, twins_across_pages, runaway_order]


if __name__ == "__main__":
    raise SystemExit(e2e.main(e2e.run_scenarios(SCENARIOS)))
