#!/usr/bin/env python3
"""The demo's burst and report: publishes N charge commands (10% of them
twice, a few bad ones), waits until every attempt is settled, then refunds
some of them (in full, in part, some twice, some past their charge, some of
declined charges), and reports attempts by status, what the provider
charged, double charges, refunds by status, what the provider refunded
(no refund key executed twice, no charge refunded past its amount), dead
letters and the elapsed time; then a shop that ships later
(demo_authorize.py): authorizations, captures, voids and refunds of
captured money, the provider's totals beside charged's, and the order
service's (--orders-service: it ships and cancels what it authorized).
Python standard library, psql and kcat."""
import argparse
import json
import os
import random
import subprocess
import sys
import time
import urllib.request
import uuid

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "examples",
                                "order_service"))
from refund_policy import REFUND_EVERY  # noqa: E402

import demo_authorize  # noqa: E402
from demo_common import psql, say  # noqa: E402,F401 (say: the test aligns its lines)


def dlq_count():
    """Every dead letter on the topic, as 'partition:offset headers' lines
    (the stack outlives a demo run: positions tell this run's letters)."""
    out = subprocess.run(["kcat", "-C", "-b", os.environ["KAFKA_BOOTSTRAP_SERVERS"], "-t",
                          os.environ.get("CHARGE_DLQ_TOPIC", "payments.charge.commands.dlq"),
                          "-o", "beginning", "-e", "-q", "-f", "%p:%o %h\n"],
                         capture_output=True).stdout.decode()
    return [l for l in out.splitlines() if "dlq.reason=" in l]


def order_service_report(orders_db, deadline):
    """The example order service's side: its orders, the result events it
    took (once each), and its paid marks, set by charged's api answers,
    next to charged's statuses."""
    attempts = [r[0] for r in psql("SELECT payment_attempt_id FROM order_attempts", orders_db)]
    if not attempts:
        say("order service", "no orders placed")
        return
    ids = "','".join(attempts)
    want = int(psql("SELECT count(*) FROM outbox WHERE payment_attempt_id IN ('%s')" % ids)[0][0])
    while int(psql("SELECT count(*) FROM processed_events WHERE payment_attempt_id IN ('%s')"
                   % ids, orders_db)[0][0]) < want:
        if time.monotonic() > deadline:
            print("demo: the order service did not receive every event", file=sys.stderr)
            break
        time.sleep(0.5)
    # Each event only asks; charged's answer pays: wait for the answers.
    while int(psql("SELECT (SELECT count(*) FROM order_attempts WHERE confirm_due) + "
                   "(SELECT count(*) FROM order_refunds WHERE confirm_due)", orders_db)[0][0]):
        if time.monotonic() > deadline:
            print("demo: the order service is still asking charged about some rows (not "
                  "settled there yet)", file=sys.stderr)
            break
        time.sleep(0.5)
    charged = dict(psql("SELECT status, count(*) FROM payment_attempts WHERE id IN ('%s') "
                        "GROUP BY 1" % ids))
    got = psql("SELECT count(*), count(DISTINCT event_id) FROM processed_events WHERE "
               "payment_attempt_id IN ('%s')" % ids, orders_db)[0]
    paid = psql("SELECT count(*) FILTER (WHERE paid), count(*), sum(refunded_amount) FROM orders",
                orders_db)[0]
    say("order service", "%s orders, %s paid (charged: %s); %s result events applied, "
          "each once (%s distinct)" % (paid[1], paid[0], ", ".join(
              "%s %s" % kv for kv in sorted(charged.items())), got[0], got[1]))
    refunds = psql("SELECT coalesce(confirmed_status, 'not answered'), count(*) FROM "
                   "order_refunds GROUP BY 1 ORDER BY 2 DESC", orders_db)
    say("order service refunds", "%s; %s refunded in its books" % (
        ", ".join("%s %s" % tuple(kv) for kv in refunds) or "none", paid[2]))


def refund_burst(a, cmds, ids, rnd, deadline):
    """Refunds a share of the burst's settled attempts: a tenth of the
    SUCCEEDED ones, half in full (a few of those followed by a refund of 1
    more: REJECTED exceeds_charge), half in part; a few declined ones
    (REJECTED not_refundable); 10% of the commands sent twice. Waits until
    none is left to a worker; returns the refund ids."""
    status = dict(psql("SELECT id, status FROM payment_attempts WHERE id IN ('%s')" % ids))
    refunds = []

    def refund(c, amount, reason="requested_by_customer"):
        r = str(uuid.uuid4())
        refunds.append({"type": "refund.requested", "version": 1, "refund_id": r,
                        "payment_attempt_id": c["payment_attempt_id"],
                        "idempotency_key": "refund:" + r, "amount": amount, "reason": reason})
    succeeded = [c for c in cmds if status.get(c["payment_attempt_id"]) == "SUCCEEDED"]
    for i, c in enumerate(rnd.sample(succeeded, len(succeeded) // 10)):
        if i % 2:
            refund(c, max(1, c["amount"] // 3), "duplicate")
        else:
            refund(c, c["amount"])
            if i % 10 == 0:
                refund(c, 1)
    failed = [c for c in cmds if status.get(c["payment_attempt_id"]) == "FAILED"]
    for c in failed[:5]:
        refund(c, c["amount"], "fraudulent")
    burst = []
    for r in refunds:
        burst.append(r)
        if rnd.random() < 0.10:
            burst.append(r)
    path = os.path.join(a.state, "refunds.jsonl")
    with open(path, "w") as f:
        f.writelines(json.dumps(r) + "\n" for r in burst)
    # One producer: a charge's refunds reach its partition in this order.
    subprocess.run([a.chargectl, "publish", "--file", path], check=True, stdout=subprocess.DEVNULL)
    print("demo: published %d refund commands (%d refunds, %d duplicates)" %
          (len(burst), len(refunds), len(burst) - len(refunds)))
    rids = [r["refund_id"] for r in refunds]
    wait_refunds(rids, deadline)
    return rids


def wait_refunds(rids, deadline):
    """Until every refund is recorded and none is PENDING or held by a worker.
    UNKNOWN ones stay so: they are the reconciler's."""
    ids = "','".join(rids)
    while True:
        total, open_ = psql("SELECT count(*), count(*) FILTER (WHERE status = 'PENDING' OR "
                            "(status = 'PROCESSING' AND lease_owner IS NOT NULL)) "
                            "FROM refund_attempts WHERE id IN ('%s')" % ids)[0]
        if int(total) == len(rids) and open_ == "0":
            return
        if time.monotonic() > deadline:
            print("demo: refunds not settled (%s of %d recorded, %s open)" %
                  (total, len(rids), open_), file=sys.stderr)
            return
        time.sleep(0.5)


def refund_report(psp_ledger, rids, charge_ledger):
    """Refunds by status, what was refunded, and the provider's side: each
    refund key executed at most once, no charge refunded past its amount.
    Returns the number of violations."""
    ids = "','".join(rids)
    by_status = psql("SELECT status, count(*) FROM refund_attempts WHERE id IN ('%s') "
                     "GROUP BY 1 ORDER BY 2 DESC" % ids)
    rejected = psql("SELECT split_part(reason, ':', 1), count(*) FROM refund_attempts WHERE "
                    "id IN ('%s') AND status = 'REJECTED' GROUP BY 1 ORDER BY 1" % ids)
    total = psql("SELECT coalesce(sum(amount), 0) FROM refund_attempts WHERE id IN ('%s') AND "
                 "status = 'SUCCEEDED'" % ids)[0][0]
    books = psql("SELECT coalesce(sum(amount), 0) FROM ledger_entries WHERE kind = 'refund' "
                 "AND refund_id IN ('%s')" % ids)[0][0]
    executions = psp_ledger.get("refund_executions", {})
    twice = sum(1 for n in executions.values() if int(n) > 1)
    charged = {c["payment_intent_id"]: int(c["amount"]) for c in charge_ledger
               if c["outcome"] == "succeeded"}
    refunded = {}
    for r in psp_ledger.get("refunds", []):
        if r["status"] not in ("failed", "canceled"):
            refunded[r["payment_intent_id"]] = refunded.get(r["payment_intent_id"], 0) + \
                int(r["amount"])
    past = sum(1 for pi, n in refunded.items() if n > charged.get(pi, 0))
    # The provider's refunds of these refunds; an answer lost after it
    # refunded leaves one UNKNOWN here, which only the provider's evidence
    # can settle.
    unknown = {r[0] for r in psql("SELECT id FROM refund_attempts WHERE id IN ('%s') AND "
                                  "status IN ('UNKNOWN', 'PROCESSING')" % ids)}
    mine = [r for r in psp_ledger.get("refunds", []) if r["status"] == "succeeded" and
            (r.get("metadata") or {}).get("refund_id") in set(rids)]
    at_psp = sum(int(r["amount"]) for r in mine)
    at_psp_unknown = sum(int(r["amount"]) for r in mine if r["metadata"]["refund_id"] in unknown)
    counts = dict(by_status)
    others = ", ".join("%s %s" % (st, n) for st, n in by_status
                       if st not in ("SUCCEEDED", "REJECTED"))
    say("refunds requested", "%d (the burst's and the order service's)" % len(rids))
    say("refunds by status", "SUCCEEDED %s, REJECTED %s (%s); others: %s" % (
        counts.get("SUCCEEDED", 0), counts.get("REJECTED", 0),
        ", ".join("%s %s" % tuple(kv) for kv in rejected) or "none", others or "none"))
    say("refunded", "%s here (ledger %s); %d at the provider, %d of it by refunds "
          "UNKNOWN here" % (total, books, at_psp, at_psp_unknown))
    say("refunds at provider", "%d executed; keys executed twice: %d; charges refunded "
          "past their amount: %d" % (len(executions), twice, past))
    return twice + past


def webhook_report(demo_start):
    """What the provider's webhooks did during this run."""
    rows = psql("SELECT outcome, count(*) FROM processed_webhook_events WHERE received_at >= "
                "to_timestamp(%d) GROUP BY 1 ORDER BY 1" % demo_start)
    say("webhooks", ", ".join("%s %s" % tuple(r) for r in rows) or "none")


def status_query(api):
    """The query a client that lost its answer makes instead of charging
    again: the newest attempt, as the api answers it."""
    rows = psql("SELECT id FROM payment_attempts ORDER BY updated_at DESC LIMIT 1")
    if not rows:
        return
    path = "/v1/payment-attempts/" + rows[0][0]
    doc = json.load(urllib.request.urlopen("http://%s%s" % (api, path), timeout=10))
    say("status query", "GET %s: %s" % (path, ", ".join(
        "%s %s" % (k, doc[k]) for k in ("status", "amount", "currency", "provider_payment_id")
        if doc.get(k) is not None)))


def audit_report(a):
    """chargectl audit run over everything psp-sim made since the demo
    began, against the ledger (docs/auditor.md). 0, or 1 when it found a
    mismatch or did not see every object psp-sim made."""
    since = int(time.time()) - a.demo_start + 1
    path = os.path.join(a.state, "audit.json")
    with open(path, "w") as f:
        rc = subprocess.run([a.chargectl, "audit", "run", "--since", "%ds" % since, "--json"],
                            stdout=f).returncode
    if rc != 0:
        print("demo: the audit found a mismatch (see %s)" % path, file=sys.stderr)
        return 1
    with open(path) as f:
        v = json.load(f)
    psp = json.load(urllib.request.urlopen(a.psp_admin + "/ledger"))["counters"]
    say("audit", "%d intents and %d refunds of psp-sim's %d and %d, %d ledger rows, "
        "%d findings" % (v["intents_seen"], v["refunds_seen"], psp["intents"],
                         psp["refund_objects"], v["ledger_rows_seen"], v["findings_total"]))
    if (v["intents_seen"], v["refunds_seen"]) != (psp["intents"], psp["refund_objects"]):
        print("demo: the audit did not see every object psp-sim made", file=sys.stderr)
        return 1
    return 0


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--commands", type=int, default=1000)
    ap.add_argument("--psp-admin", required=True)
    ap.add_argument("--chargectl", required=True)
    ap.add_argument("--state", required=True)
    ap.add_argument("--orders-db", help="the example order service's database")
    ap.add_argument("--api", help="the api's address, for a status query")
    ap.add_argument("--orders-service",
                    help="the order service's command (python and script): it ships and "
                    "cancels its authorized orders")
    ap.add_argument("--authorizations", type=int, default=200,
                    help="authorizations of the shop that ships later (0: none)")
    ap.add_argument("--demo-start", type=int, default=int(time.time()),
                    help="unix time the demo began: webhooks and the audit since then")
    a = ap.parse_args()

    for _ in range(100):
        try:
            urllib.request.urlopen(a.psp_admin + "/health", timeout=2)
            break
        except OSError:
            time.sleep(0.1)
    start_db = psql("SELECT now()")[0][0]
    dlq_before = {l.split(" ", 1)[0] for l in dlq_count()}
    rnd = random.Random()
    cmds = []
    for _ in range(a.commands):
        attempt = str(uuid.uuid4())
        cmds.append({"type": "charge.requested", "version": 1, "payment_attempt_id": attempt,
                     "order_id": str(uuid.uuid4()), "idempotency_key": "attempt:" + attempt,
                     "amount": rnd.randint(100, 50000), "currency": "EUR",
                     "payment_method": "pm_card_chargeDeclined" if rnd.random() < 0.02
                     else "pm_card_visa"})
    burst = []
    for c in cmds:
        burst.append(c)
        if rnd.random() < 0.10:
            burst.append(c)
    path = os.path.join(a.state, "burst.jsonl")
    with open(path, "w") as f:
        f.writelines(json.dumps(c) + "\n" for c in burst)
    bad = [
        "%s\t{\"type\": \"charge.requested\", " % uuid.uuid4(),
        "not-an-attempt-id\t" + json.dumps(dict(cmds[0], payment_attempt_id=str(uuid.uuid4()))),
        "%s\t{\"type\":\"charge.requested\",\"version\":1,\"payment_method\":\"4242424242424242\"}" % uuid.uuid4(),
    ]
    t0 = time.monotonic()
    subprocess.run([a.chargectl, "publish", "--file", path], check=True, stdout=subprocess.DEVNULL)
    subprocess.run(["kcat", "-P", "-b", os.environ["KAFKA_BOOTSTRAP_SERVERS"], "-t",
                    os.environ.get("CHARGE_COMMANDS_TOPIC", "payments.charge.commands"), "-K", "\t"],
                   input=("\n".join(bad) + "\n").encode(), check=True)
    print("demo: published %d messages (%d attempts, %d duplicates) and %d bad ones" %
          (len(burst), len(cmds), len(burst) - len(cmds), len(bad)))
    ids = "','".join(c["payment_attempt_id"] for c in cmds)
    deadline = time.monotonic() + 600
    while True:
        rows = psql("SELECT count(*), count(*) FILTER (WHERE status = 'PENDING' OR "
                    "(status = 'PROCESSING' AND lease_owner IS NOT NULL)) "
                    "FROM payment_attempts WHERE id IN ('%s')" % ids)
        total, open_ = int(rows[0][0]), int(rows[0][1])
        letters = sum(1 for l in dlq_count() if l.split(" ", 1)[0] not in dlq_before)
        if total == len(cmds) and open_ == 0 and letters >= len(bad):
            break
        if time.monotonic() > deadline:
            print("demo: not settled after 600 s (%d of %d recorded, %d open)" %
                  (total, len(cmds), open_), file=sys.stderr)
            return 1
        time.sleep(0.5)
    elapsed = time.monotonic() - t0
    workers_done = psql("SELECT status, count(*) FROM payment_attempts WHERE id IN ('%s') "
                        "GROUP BY 1 ORDER BY 2 DESC" % ids)

    # The reconciler settles what the workers could not know.
    while psql("SELECT count(*) FROM payment_attempts WHERE id IN ('%s') AND status IN "
               "('UNKNOWN', 'PROCESSING')" % ids)[0][0] != "0":
        if time.monotonic() > deadline:
            print("demo: unknown outcomes not settled after 600 s", file=sys.stderr)
            return 1
        time.sleep(0.5)
    reconciled = time.monotonic() - t0
    by_reconciler = psql("SELECT new_status, count(*) FROM attempt_transitions t WHERE "
                         "cause = 'reconciler' AND payment_attempt_id IN ('%s') "
                         "GROUP BY 1 ORDER BY 2 DESC" % ids)

    by_status = psql("SELECT status, count(*) FROM payment_attempts WHERE id IN ('%s') "
                     "GROUP BY 1 ORDER BY 2 DESC" % ids)
    # The relay publishes every result event of these attempts.
    while psql("SELECT count(*) FROM outbox WHERE published_at IS NULL AND "
               "payment_attempt_id IN ('%s')" % ids)[0][0] != "0":
        if time.monotonic() > deadline:
            print("demo: result events not published after 600 s", file=sys.stderr)
            return 1
        time.sleep(0.5)

    # Refunds: the burst's, and those the order service asks for by itself
    # once it has applied its orders' payments.
    rids = refund_burst(a, cmds, ids, rnd, deadline)
    if a.orders_db:
        # Its orders settled and applied first: it refunds only paid orders.
        theirs = "','".join(r[0] for r in psql("SELECT payment_attempt_id FROM order_attempts",
                                               a.orders_db))
        while time.monotonic() < deadline:
            open_, succ = psql("SELECT count(*) FILTER (WHERE status IN ('PENDING', "
                               "'PROCESSING', 'UNKNOWN')), count(*) FILTER (WHERE status = "
                               "'SUCCEEDED') FROM payment_attempts WHERE id IN ('%s')"
                               % theirs)[0]
            paid = psql("SELECT count(*) FROM orders WHERE paid", a.orders_db)[0][0]
            if open_ == "0" and paid == succ:
                break
            time.sleep(0.5)
        want = int(psql("SELECT count(*) FROM orders WHERE paid AND seq %% %d = 0" %
                        REFUND_EVERY, a.orders_db)[0][0])
        while True:
            ours = [r[0] for r in psql("SELECT r.refund_id FROM order_refunds r JOIN outbox o "
                                       "ON o.command_id = r.refund_id WHERE o.sent_at IS NOT "
                                       "NULL", a.orders_db)]
            if len(ours) >= want or time.monotonic() > deadline:
                break
            time.sleep(0.5)
        wait_refunds(ours, deadline)
        rids += ours
    while psql("SELECT count(*) FROM outbox WHERE published_at IS NULL AND "
               "refund_id IN ('%s')" % "','".join(rids))[0][0] != "0":
        if time.monotonic() > deadline:
            print("demo: refund events not published after 600 s", file=sys.stderr)
            return 1
        time.sleep(0.5)
    events = psql("SELECT event_type, count(*) FROM outbox WHERE payment_attempt_id IN "
                  "('%s') GROUP BY 1 ORDER BY 2 DESC" % ids)
    psp_ledger = json.load(urllib.request.urlopen(a.psp_admin + "/ledger"))
    ledger = psp_ledger["charges"]
    per_key = {}
    for c in ledger:
        per_key[c["idempotency_key"]] = per_key.get(c["idempotency_key"], 0) + 1
    double = sum(1 for v in per_key.values() if v > 1)
    succeeded = {c["payment_attempt_id"] for c in ledger if c["outcome"] == "succeeded"}
    # psp-sim is this run's: its charges are the burst's and the order
    # service's attempts.
    mine = ids
    if a.orders_db:
        extra = [r[0] for r in psql("SELECT payment_attempt_id FROM order_attempts",
                                    a.orders_db)]
        mine = "','".join([ids] + extra) if extra else ids
    recorded = {r[0] for r in psql("SELECT id FROM payment_attempts WHERE status = 'SUCCEEDED' "
                                   "AND id IN ('%s')" % mine)}
    reasons = {}
    for line in (l for l in dlq_count() if l.split(" ", 1)[0] not in dlq_before):
        for part in line.split(" ", 1)[1].split(","):
            if part.startswith("dlq.reason="):
                r = part.split("=", 1)[1]
                reasons[r] = reasons.get(r, 0) + 1
    print()
    say("after the workers", ", ".join("%s %s" % (s, n) for s, n in workers_done))
    say("settled by reconciler", (", ".join("%s %s" % (s, n) for s, n in by_reconciler)
                                      or "none"))
    say("attempts by status", ", ".join("%s %s" % (s, n) for s, n in by_status))
    unknown = sum(int(n) for s, n in by_status if s in ("UNKNOWN", "PROCESSING"))
    say("unknown or processing", "%d" % unknown)
    say("charges at provider", "%d executed, %d succeeded" % (len(ledger), len(succeeded)))
    say("double charges", "%d" % double)
    say("events published", ", ".join("%s %s" % (t, n) for t, n in events))
    say("succeeded, unbooked", "%d (charged at the provider, not SUCCEEDED here)" %
          len(succeeded - recorded))
    say("dead letters", "%d (%s)" % (sum(reasons.values()),
                                              ", ".join("%s %d" % kv for kv in sorted(reasons.items()))))
    bad_refunds = refund_report(psp_ledger, rids, ledger)
    bad_holds = (demo_authorize.authorize_burst(a, rnd, time.monotonic() + 600)
                 if a.authorizations > 0 else 0)
    if a.orders_db and a.orders_service:
        bad_holds += demo_authorize.order_service_holds(a, time.monotonic() + 300)
    if a.orders_db:
        order_service_report(a.orders_db, deadline)
    say("elapsed", "%.1f s for %d messages, %.1f s until nothing was unknown" %
        (elapsed, len(burst) + len(bad), reconciled))
    webhook_report(a.demo_start)
    if a.api:
        status_query(a.api)
    bad_audit = audit_report(a)
    return 0 if double == 0 and bad_refunds == 0 and bad_holds == 0 and bad_audit == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
