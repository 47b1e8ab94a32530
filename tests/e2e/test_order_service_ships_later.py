#!/usr/bin/env python3
"""examples/order_service as a shop that ships later, on the real stack:
Kafka, PostgreSQL, psp-sim (its webhooks to charged's api), a worker, a
reconciler, a relay, the api and the order service's `run`. Judged from
psp-sim's ledger (what the provider did), not from anyone's tables alone.

1. place-orders --authorize: every order charged holds is authorized in
   the service (a decline is tried once more, authorizing too).
2. ship (some with an item missing: a partial capture, some whole) and
   cancel: each shipped order captured once at psp-sim, for what it
   shipped; each canceled one voided, nothing captured of it; the
   service's report (authorized, captured, released, voided, refunded)
   equal to psp-sim's and to charged's, no alarm.
3. psp-sim's authorization expiry made short (PUT /authorization-expiry,
   its webhooks to the api): each order neither shipped nor canceled
   raises authorization_expired once, nothing of it is captured, and the
   three sets of totals still agree (a lapsed hold is released and voided
   at the provider)."""
import json
import os
import subprocess

import charged_api as api
import charged_e2e as e2e
import order_service_e2e as oe
from charged_e2e import check, check_eq

HERE = os.path.dirname(os.path.abspath(__file__))
SOURCE = os.environ.get("CHARGED_SOURCE_DIR") or os.path.join(HERE, "..", "..")
SERVICE = os.path.join(SOURCE, "examples", "order_service", "order_service.py")
PYTHON = os.environ.get("ORDER_SERVICE_PYTHON",
                        os.path.join(SOURCE, "deploy", ".tools", "bin", "python"))
ORDERS = 12
LINES = ("authorized", "captured", "released", "voided", "refunded")


def quiet(s, orders_db):
    """Nothing open anywhere: charged's attempts, captures, voids and
    refunds settled, its events published, the service's commands sent and
    every row it was asked about answered."""
    r = s.query("SELECT (SELECT count(*) FROM payment_attempts WHERE status IN "
                "('PENDING','PROCESSING','UNKNOWN')) + (SELECT count(*) FROM capture_attempts "
                "WHERE status IN ('PENDING','PROCESSING','UNKNOWN')) + (SELECT count(*) FROM "
                "void_attempts WHERE status IN ('PENDING','PROCESSING','UNKNOWN')) + (SELECT "
                "count(*) FROM refund_attempts WHERE status IN ('PENDING','PROCESSING',"
                "'UNKNOWN')) + (SELECT count(*) FROM outbox WHERE published_at IS NULL)")
    return r == [["0"]] and oe.rows(s, orders_db, (
        "SELECT (SELECT count(*) FROM outbox WHERE sent_at IS NULL) + (SELECT count(*) FROM "
        "order_attempts WHERE confirm_due OR applied_status IS NULL) + (SELECT count(*) FROM "
        "order_captures WHERE confirm_due OR confirmed_status IS NULL) + (SELECT count(*) FROM "
        "order_voids WHERE confirm_due OR confirmed_status IS NULL) + (SELECT count(*) FROM "
        "order_refunds WHERE confirm_due OR confirmed_status IS NULL)")) == [["0"]]


def provider_totals(s, attempts):
    """psp-sim's totals of our attempts' authorizations, in minor units."""
    led = s.psp_get("/ledger")
    held = {c["payment_intent_id"]: int(c["amount_authorized"]) for c in led["charges"]
            if c.get("kind") == "authorization" and c["payment_attempt_id"] in attempts
            and c["outcome"] in ("requires_capture", "succeeded", "canceled")}
    caps = [c for c in led.get("captures", []) if c["payment_intent_id"] in held]
    gone = [c for c in led.get("cancels", []) + led.get("expiries", [])
            if c["payment_intent_id"] in held and c.get("kind", "expiry") in ("void", "expiry")]
    refunds = [r for r in led.get("refunds", []) if r["payment_intent_id"] in held
               and r["status"] == "succeeded"]
    return {"authorized": sum(held.values()),
            "captured": sum(int(c["amount"]) for c in caps),
            "released": sum(int(c.get("amount_released") or 0) for c in caps + gone),
            "voided": sum(int(c.get("amount_released") or 0) for c in gone),
            "refunded": sum(int(r["amount"]) for r in refunds)}, led


def charged_totals(s, attempts):
    """charged's totals of the same attempts, from its tables."""
    ids = "','".join(attempts)
    n = [int(x) for x in s.query(
        "SELECT coalesce(sum(amount) FILTER (WHERE status IN ('AUTHORIZED','SUCCEEDED',"
        "'VOIDED')), 0), coalesce(sum(captured_amount) FILTER (WHERE status = 'SUCCEEDED'), 0),"
        " coalesce(sum(amount - coalesce(captured_amount, 0)) FILTER (WHERE status IN "
        "('SUCCEEDED','VOIDED')), 0), coalesce(sum(amount) FILTER (WHERE status = 'VOIDED'), 0),"
        " (SELECT coalesce(sum(amount), 0) FROM refund_attempts WHERE status = 'SUCCEEDED' AND "
        "payment_attempt_id IN ('%s')) FROM payment_attempts WHERE id IN ('%s')"
        % (ids, ids))[0]]
    return dict(zip(LINES, n))


def check_totals(s, cli, attempts, when):
    provider, led = provider_totals(s, attempts)
    ours = json.loads(cli("report"))["authorizations"]
    e2e.log("%s: provider %s, charged %s, order service %s" % (
        when, provider, charged_totals(s, attempts), ours))
    check_eq(charged_totals(s, attempts), provider, "charged's totals vs psp-sim's " + when)
    check_eq({k: ours[k] for k in LINES}, provider, "the order service's report vs psp-sim's "
             + when)
    return led


def check_steps(s, orders_db, led):
    """Each shipped order captured once at psp-sim for what it shipped,
    each canceled one voided once and never captured."""
    intent = {c["payment_attempt_id"]: c["payment_intent_id"] for c in led["charges"]}
    caps, voids = {}, {}
    for c in led.get("captures", []):
        caps.setdefault(c["payment_intent_id"], []).append(int(c["amount"]))
    for c in led.get("cancels", []):
        if c.get("kind") == "void":
            voids[c["payment_intent_id"]] = voids.get(c["payment_intent_id"], 0) + 1
    shipped = oe.rows(s, orders_db, "SELECT o.authorized_attempt_id, c.amount FROM orders o "
                      "JOIN order_captures c USING (order_id) WHERE o.fulfilment = 'shipped'")
    canceled = oe.rows(s, orders_db, "SELECT authorized_attempt_id FROM orders WHERE "
                       "fulfilment = 'canceled'")
    partial = oe.rows(s, orders_db, "SELECT count(*) FROM orders o JOIN order_captures c "
                      "USING (order_id) WHERE c.amount < o.amount")[0][0]
    check(int(partial) > 0, "some orders shipped with an item missing")
    for attempt, amount in shipped:
        check_eq(caps.get(intent[attempt]), [int(amount)], "psp-sim's captures of a shipped "
                 "order (what it shipped, once)")
    for attempt, in canceled:
        check_eq((voids.get(intent[attempt]), caps.get(intent[attempt])), (1, None),
                 "psp-sim's voids and captures of a canceled order")
    return {intent[a] for a, _ in shipped}


def scenario(new):
    check(os.access(PYTHON, os.X_OK), "%s missing: run deploy/install-deps.sh" % PYTHON)
    port = e2e.free_port()
    s = new("oe_ships_later", partitions=3, psp_args=api.psp_webhook_args(port))
    p = None
    try:
        orders_db_name = s.tag.lower() + "_orders"
        s.psql(s.admin_db, 'CREATE DATABASE "%s"' % orders_db_name)
        orders_db = s.db.rsplit("/", 1)[0] + "/" + orders_db_name
        s.start_worker()
        s.start_reconciler(RECONCILER_SCHEDULE_MS=200, RECONCILER_POLL_MS=100)
        s.start_relay(RELAY_POLL_MS=100)
        env = oe.service_env(s, orders_db, api_port=port)

        def cli(*args):
            r = subprocess.run([PYTHON, SERVICE] + list(args), env=env, capture_output=True,
                               timeout=60)
            check_eq(r.returncode, 0, "order_service %s exit (%s)" % (args[0], r.stderr[-500:]))
            return r.stdout.decode()

        cli("init")
        p = subprocess.Popen([PYTHON, SERVICE, "run"], env=env,
                             stdout=open(os.path.join(s.dir, "order_service.log"), "ab"),
                             stderr=subprocess.STDOUT, start_new_session=True)

        # 1. Authorized at checkout.
        cli("place-orders", "--count", str(ORDERS), "--authorize")
        e2e.wait_until("every order authorized or declined twice, all quiet",
                       lambda: quiet(s, orders_db), 40, 0.3)
        held = int(oe.rows(s, orders_db, "SELECT count(*) FROM orders WHERE "
                           "authorized_attempt_id IS NOT NULL")[0][0])
        check(held >= 10, "orders authorized (%d of %d)" % (held, ORDERS))
        attempts = {a for a, in oe.rows(s, orders_db,
                                         "SELECT payment_attempt_id FROM order_attempts")}

        # 2. Shipped (three with an item missing, three whole) and canceled.
        cli("ship", "--count", "3", "--missing-item-ratio", "1")
        cli("ship", "--count", "3")
        cli("cancel", "--count", "3")
        e2e.wait_until("captures, voids and refunds settled and confirmed",
                       lambda: quiet(s, orders_db), 40, 0.3)
        led = check_totals(s, cli, attempts, "after ship and cancel")
        shipped = check_steps(s, orders_db, led)
        check_eq(oe.rows(s, orders_db, "SELECT kind, count(*) FROM order_alarms GROUP BY 1"),
                 [], "alarms after ship and cancel")

        # 3. The holds left lapse at the provider.
        left = {o for o, in oe.rows(s, orders_db, "SELECT order_id FROM orders WHERE "
                                    "authorized_attempt_id IS NOT NULL AND fulfilment IS NULL")}
        check(left, "orders neither shipped nor canceled")
        s.psp_put("/authorization-expiry", {"authorization_expiry_ms": 200})
        e2e.wait_until("every hold left told authorization_expired", lambda: {
            o for o, in oe.rows(s, orders_db, "SELECT order_id FROM order_alarms WHERE kind = "
                                "'authorization_expired'")} == left and quiet(s, orders_db),
            30, 0.3)
        led = check_totals(s, cli, attempts, "after the expiry")
        check_eq(sorted(c["payment_intent_id"] for c in led.get("captures", [])),
                 sorted(shipped), "psp-sim captured the shipped orders only")
        check_eq(oe.rows(s, orders_db, "SELECT kind, count(*) FROM order_alarms GROUP BY 1"),
                 [["authorization_expired", str(len(left))]], "alarms, each once")
        check_eq(oe.rows(s, orders_db, "SELECT count(*) FROM orders WHERE paid AND "
                         "fulfilment IS DISTINCT FROM 'shipped'"), [["0"]],
                 "orders paid though not shipped")
        check(p.poll() is None, "the order service exited on its own")
        p.send_signal(15)
        check_eq(p.wait(timeout=30), 0, "the order service's exit status on SIGTERM")
        p = None
    finally:
        if p is not None and p.poll() is None:
            os.killpg(p.pid, 9)
            p.wait()


if __name__ == "__main__":
    raise SystemExit(e2e.main(scenario))
