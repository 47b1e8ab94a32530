#!/usr/bin/env python3
"""The auditor proves from psp-sim's own books that nothing was charged
twice (docs/auditor.md).

1. clean_then_injected: charges (one declined, a duplicate, a refund)
   settle; an auditor audits every window since the run began: no finding,
   and the verdicts saw exactly psp-sim's intents and refunds and the
   ledger's rows. It stops; more charges settle, and psp-sim is given what
   a broken integration or a person with dashboard access makes: a second
   charge of one attempt under a new key, one of an order under a new
   attempt, an intent outside charged, a booked intent deleted, an amount
   changed, a refund past its charge. The auditor, started again, resumes
   at its watermark and finds each within that cycle, with the kind and
   the ids an operator needs; chargectl audit run exits 1 on them, and the
   finding counter shows it. Nothing is recorded twice.
2. bulk_kill_two: 100,000 intents in one second of psp-sim, each matching a
   SUCCEEDED attempt and its ledger row, and five made outside charged. An
   auditor is killed in the middle of that window; two more then run at
   once. The window is recorded once, with all 100,000 + 5 intents and
   100,000 ledger rows, the five unknown intents once each, the windows
   tile time without gap or overlap, and the auditor's peak memory stays
   within a worker's.

Scenarios can be run alone: test_auditor.py bulk_kill_two"""
import json
import os
import signal
import sys
import time
import uuid

import charged_e2e as e2e
from charged_e2e import check, check_eq

# Short windows, so that a test sees several; a lag that covers psp-sim's
# list (it has none) and our transactions' commit.
AUDITOR = {"AUDITOR_WINDOW_MS": 2000, "AUDITOR_LAG_MS": 1500, "AUDITOR_POLL_MS": 200}
KINDS = ("charged_twice", "charged_unbooked", "booked_not_charged", "amount_mismatch",
         "currency_mismatch", "unknown_intent", "refund_unbooked", "refunded_over_charge",
         "booked_foreign", "foreign_intent")


def db_now(s):
    return float(s.query("SELECT extract(epoch FROM now())")[0][0])


def wait_watermark(s, past, timeout=120):
    """Until the scheduled windows reach `past` (unix s)."""
    e2e.wait_until("audit watermark past %d" % past,
                   lambda: s.audit_totals()["watermark"] > past, timeout)


def findings(s):
    rows = s.query("SELECT kind, object_id, coalesce(payment_attempt_id, ''),"
                   " coalesce(order_id, ''), coalesce(other_object_id, ''),"
                   " coalesce(provider_amount, -1), coalesce(ledger_amount, -1)"
                   " FROM audit_findings ORDER BY id")
    return [dict(zip(("kind", "object", "attempt", "order", "other", "provider_amount",
                      "ledger_amount"), r)) for r in rows]


def check_windows_tile(s):
    rows = s.query("SELECT extract(epoch FROM window_start)::bigint,"
                   " extract(epoch FROM window_end)::bigint FROM audit_windows"
                   " WHERE scheduled ORDER BY window_start")
    for (a0, b0), (a1, b1) in zip(rows, rows[1:]):
        check_eq(a1, b0, "a scheduled window starts where the one before ended")
    return len(rows)


def charge_and_settle(s, cmds, refunds=()):
    s.publish(cmds)
    s.wait_settled(len({c["payment_attempt_id"] for c in cmds}), timeout=120)
    if refunds:
        s.publish(list(refunds))
        e2e.wait_until("refunds settled", lambda: int(s.query(
            "SELECT count(*) FROM refund_attempts WHERE status IN ('SUCCEEDED', 'FAILED',"
            " 'REJECTED')")[0][0]) >= len(refunds), e2e.scaled(60))


def psp_intent_of(s, attempt_id):
    return s.query("SELECT provider_payment_id FROM payment_attempts WHERE id = '%s'"
                   % attempt_id)[0][0]


def clean_then_injected(new):
    s = new("audit_clean")
    t0 = int(db_now(s)) - 2
    w = s.start_worker()
    good = [e2e.new_command() for _ in range(30)]
    declined = e2e.new_command(payment_method="pm_card_chargeDeclined")
    cmds = good + [declined, dict(good[0])]
    charge_and_settle(s, cmds, [e2e.new_refund(good[1], 500)])
    t1 = int(db_now(s)) + 1

    au = s.start_auditor(AUDITOR_FROM=t0, **AUDITOR)
    wait_watermark(s, t1)
    tot = s.audit_totals()
    ledger = s.psp_get("/ledger")
    n_ledger = int(s.query("SELECT count(*) FROM ledger_entries")[0][0])
    check_eq(tot["findings"], 0, "findings after a clean run")
    check_eq(findings(s), [], "finding rows after a clean run")
    check_eq(tot["intents"], ledger["counters"]["intents"], "intents audited against psp-sim's")
    check_eq(tot["refunds"], ledger["counters"]["refund_objects"], "refunds audited against psp-sim's")
    check_eq(tot["ledger_rows"], n_ledger, "ledger rows audited against the ledger's")
    check(n_ledger == len(good) + 1, "ledger: %d rows for %d charges and a refund"
          % (n_ledger, len(good)))
    check_windows_tile(s)
    rc, out, err = s.audit("run", "--since", "%ds" % (int(db_now(s)) - t0 + 1), "--json")
    check_eq(rc, 0, "chargectl audit run after a clean run (%s)" % err)
    v = json.loads(out)
    check_eq((v["intents_seen"], v["ledger_rows_seen"], v["findings_total"]),
             (ledger["counters"]["intents"], n_ledger, 0), "the on-demand verdict")
    check_eq(s.stop_auditor(au), 0, "the auditor's exit after SIGTERM")

    # Round two: charges the auditor has not seen, then what it must catch.
    more = [e2e.new_command() for _ in range(6)]
    charge_and_settle(s, more)
    a_twice, a_order, a_deleted, a_amended, a_refunded = more[:5]
    pi = {c["payment_attempt_id"]: psp_intent_of(s, c["payment_attempt_id"]) for c in more}
    second = s.psp_put("/inject/intents", {"like": pi[a_twice["payment_attempt_id"]]},
                       method="POST")["ids"][0]
    other_attempt = str(uuid.uuid4())
    by_order = s.psp_put("/inject/intents", {
        "like": pi[a_order["payment_attempt_id"]],
        "metadata": {"payment_attempt_id": other_attempt,
                     "order_id": a_order["order_id"]}}, method="POST")["ids"][0]
    outside = s.psp_put("/inject/intents", {"amount": 4242, "metadata": {}},
                        method="POST")["ids"][0]
    s.psp_put("/intents/%s" % pi[a_deleted["payment_attempt_id"]], {}, method="DELETE")
    s.psp_put("/intents/%s/amend" % pi[a_amended["payment_attempt_id"]],
              {"amount": a_amended["amount"] + 1}, method="POST")
    over = s.psp_put("/inject/refunds", {"payment_intent": pi[a_refunded["payment_attempt_id"]],
                                          "amount": a_refunded["amount"] + 7},
                     method="POST")["id"]
    t2 = int(db_now(s)) + 1

    au = s.start_auditor(AUDITOR_FROM=t0, **AUDITOR)
    wait_watermark(s, t2)
    got = {(f["kind"], f["object"]): f for f in findings(s)}
    want = {
        ("charged_twice", second): {"attempt": a_twice["payment_attempt_id"],
                                    "other": pi[a_twice["payment_attempt_id"]]},
        # It names an attempt of ours whose own intent it is not: another
        # client's use of our metadata, said beside the page.
        ("foreign_intent", second): {"attempt": a_twice["payment_attempt_id"],
                                     "other": pi[a_twice["payment_attempt_id"]]},
        ("charged_twice", by_order): {"order": a_order["order_id"],
                                      "other": pi[a_order["payment_attempt_id"]]},
        ("unknown_intent", outside): {"provider_amount": "4242"},
        ("booked_not_charged", pi[a_deleted["payment_attempt_id"]]):
            {"attempt": a_deleted["payment_attempt_id"]},
        ("amount_mismatch", pi[a_amended["payment_attempt_id"]]):
            {"attempt": a_amended["payment_attempt_id"],
             "provider_amount": str(a_amended["amount"] + 1),
             "ledger_amount": str(a_amended["amount"])},
        ("refund_unbooked", over): {"other": pi[a_refunded["payment_attempt_id"]]},
        ("refunded_over_charge", pi[a_refunded["payment_attempt_id"]]):
            {"attempt": a_refunded["payment_attempt_id"], "other": over},
    }
    check_eq(sorted(got), sorted(want), "findings (kind, object) after the injections")
    for key, fields in want.items():
        for k, v in fields.items():
            check_eq(got[key][k], v, "%s of finding %s" % (k, key))
    tiles = check_windows_tile(s)
    check(tiles >= 2, "scheduled windows: %d" % tiles)
    metrics = s.admin_metrics(au)
    check(metrics.get('charged_audit_findings_total{kind="charged_twice"}', 0) >= 2,
          "charged_twice on the auditor's metrics: %s" % {
              k: v for k, v in metrics.items() if k.startswith("charged_audit")})

    # On demand: every kind again, none recorded twice; exit 1.
    rc, out, err = s.audit("run", "--since", "%ds" % (int(db_now(s)) - t0 + 1), "--json")
    check_eq(rc, 1, "chargectl audit run with findings (%s)" % err)
    v = json.loads(out)
    check_eq(sorted((r["kind"], r["object_id"]) for r in v["finding_rows"]), sorted(want),
             "the on-demand verdict's finding rows")
    check_eq(sum(v["new_findings"].values()), 0, "findings new to the on-demand audit")
    check_eq(len(findings(s)), len(want), "finding rows after a second audit")
    rc, out, _ = s.audit("list", "--findings")
    check(rc == 0 and "charged_twice=" in out, "audit list --findings: %s" % out)
    wid = s.query("SELECT id FROM audit_windows WHERE scheduled AND findings->>'charged_twice'"
                  " <> '0' ORDER BY id LIMIT 1")[0][0]
    rc, out, _ = s.audit("show", wid)
    check(rc == 0 and (second in out or by_order in out), "audit show %s: %s" % (wid, out))
    check_eq(s.stop_auditor(au), 0, "the auditor's exit after SIGTERM")


# Attempts, ledger rows and intents made in bulk, matching: ids from i.
BULK_ATTEMPT = "00000000-0000-4000-8000-%012d"
BULK_ORDER = "00000000-0000-4000-9000-%012d"


def bulk_setup(s, n, at):
    """n SUCCEEDED attempts with their ledger rows, and their n intents in
    psp-sim, all made at `at`; analyzed, as autovacuum keeps a real
    database."""
    s.psql(s.db, """
        INSERT INTO payment_attempts (id, order_id, idempotency_key, request_fingerprint,
            amount, currency, payment_method, status, provider_payment_id, created_at)
        SELECT format('00000000-0000-4000-8000-%%s', lpad(i::text, 12, '0'))::uuid,
               format('00000000-0000-4000-9000-%%s', lpad(i::text, 12, '0'))::uuid,
               'bulk-' || i, 'fp', 1000, 'USD', 'pm_card_visa', 'SUCCEEDED',
               'pi_bulk' || lpad(i::text, 12, '0'), to_timestamp(%d)
          FROM generate_series(0, %d) i;
        INSERT INTO ledger_entries (payment_attempt_id, order_id, kind, amount, currency,
            provider_payment_id, created_at)
        SELECT id, order_id, 'charge', amount, currency, provider_payment_id, to_timestamp(%d)
          FROM payment_attempts WHERE idempotency_key LIKE 'bulk-%%';
        ANALYZE payment_attempts;
        ANALYZE ledger_entries;
        """ % (at, n - 1, at))
    s.psp_put("/inject/intents", {
        "count": n, "id": "pi_bulk{n}", "amount": 1000, "currency": "usd",
        "created": at, "metadata": {"payment_attempt_id": "00000000-0000-4000-8000-{n}",
                                    "order_id": "00000000-0000-4000-9000-{n}"}},
        method="POST")


def peak_rss_kib(pid):
    with open("/proc/%d/status" % pid) as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1])
    return 0


def bulk_kill_two(new):
    n = 100000
    s = new("audit_bulk")
    at = int(db_now(s)) - 30
    bulk_setup(s, n, at)
    outside = s.psp_put("/inject/intents", {"count": 5, "amount": 77, "metadata": {},
                                            "created": at}, method="POST")["ids"]
    env = dict(AUDITOR, AUDITOR_FROM=at - 4, AUDITOR_WINDOW_MS=5000)

    a1 = s.start_auditor(**env)
    # Killed in the middle of the window that holds them all.
    e2e.wait_until("the first auditor in the middle of the bulk window", lambda: s.admin_metrics(
        a1).get('charged_audit_objects_total{object="intent"}', 0) >= 20000, 120, interval=0.05)
    s.stop_auditor(a1, signal.SIGKILL)
    rows = s.query("SELECT count(*) FROM audit_windows WHERE scheduled"
                   " AND window_start <= to_timestamp(%d) AND window_end > to_timestamp(%d)"
                   % (at, at))
    check_eq(rows[0][0], "0", "verdicts of the window the auditor was killed in")

    a2, a3 = s.start_auditor(**env), s.start_auditor(**env)
    peak = [0]

    def past():
        for a in (a2, a3):
            peak[0] = max(peak[0], peak_rss_kib(s.process(a).pid))
        return s.audit_totals()["watermark"] > at + 1
    e2e.wait_until("the bulk window audited", past, 300)
    v = s.query("SELECT count(*), sum(intents_seen), sum(ledger_rows_seen),"
                " count(DISTINCT auditor) FROM audit_windows WHERE scheduled"
                " AND window_start <= to_timestamp(%d) AND window_end > to_timestamp(%d)"
                % (at, at))[0]
    check_eq(v[:3], ["1", str(n + 5), str(n)], "the bulk window's verdicts, intents, ledger rows")
    got = findings(s)
    check_eq(sorted((f["kind"], f["object"]) for f in got),
             sorted(("unknown_intent", i) for i in outside), "findings of the bulk window")
    check_windows_tile(s)
    leaders = [a for a in (a2, a3) if "leading: auditing" in open(
        os.path.join(s.dir, a + ".log")).read()]
    check_eq(len(leaders), 1, "auditors that led, of two at once")
    if not os.environ.get("CHARGED_SANITIZE"):
        # A worker at 1,000 calls in flight peaks near 60 MiB: the audit of
        # any window must fit in that, whatever the window holds.
        check(0 < peak[0] < 64 * 1024, "auditors' peak RSS %d KiB" % peak[0])
    e2e.log("bulk: peak RSS %d KiB" % peak[0])
    for a in (a2, a3):
        check_eq(s.stop_auditor(a), 0, "an auditor's exit after SIGTERM")


SCENARIOS = [clean_then_injected, bulk_kill_two]


if __name__ == "__main__":
    raise SystemExit(e2e.main(e2e.run_scenarios(SCENARIOS)))
