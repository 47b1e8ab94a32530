#!/usr/bin/env python3
"""Adversary 41d, on the real stack: after charged reversed the charge
that paid an order, a status that moves and comes back makes the order
service charge the customer again on its own.

examples/order_service/README.md: "the attempt that paid the order turned
FAILED makes it unpaid and raises payment_reversed (no new attempt: a
person decides)". attempt_failed() tells "the attempt that paid the
order" by orders.paid_attempt_id, which the first FAILED cleared. charged
may move a FAILED attempt again (docs/states.md: FAILED -> REQUIRES_REVIEW
on contradicting provider evidence -> FAILED by a person): the provider's
payment_intent.succeeded for the reversed charge (its intent did succeed;
the money went back by hand) puts it in REQUIRES_REVIEW
("money moved for an attempt we called failed"), and the person says
FAILED again. The second FAILED is applied as the order's latest attempt
declining: add_attempt() with SECOND_CARD, sent, and charged by psp-sim.

The test: orders placed and paid; one paid order's charge reversed (the
provider's payment_failed after the success, then chargectl attempt
resolve --failed --force: "refunded by hand at the provider"); the service
unpays it and raises payment_reversed, and makes no attempt. Then the
provider's payment_intent.succeeded for the same intent (REQUIRES_REVIEW)
and the person's resolve --failed again. Must hold: still no second
attempt for that order, and psp-sim's ledger holds no charge of it but the
first. Before ba8e20e a second attempt was made and psp-sim charged
it: the customer is charged for an order a person had reversed."""
import json
import os
import subprocess
import time

import charged_api
import charged_e2e as e2e
import order_service_e2e as oe
from charged_e2e import check, check_eq

HERE = os.path.dirname(os.path.abspath(__file__))
SOURCE = os.environ.get("CHARGED_SOURCE_DIR") or os.path.join(HERE, "..", "..")
SERVICE = os.path.join(SOURCE, "examples", "order_service", "order_service.py")
PYTHON = os.environ.get("ORDER_SERVICE_PYTHON",
                        os.path.join(SOURCE, "deploy", ".tools", "bin", "python"))


def scenario(new):
    s = new("adv41d_recharged", worker_env={"RECONCILER_SEARCH_LAG_MS": "0"})
    check(os.access(PYTHON, os.X_OK), "%s missing: run deploy/install-deps.sh" % PYTHON)
    p = None
    try:
        orders_db_name = s.tag.lower() + "_orders"
        s.psql(s.admin_db, 'CREATE DATABASE "%s"' % orders_db_name)
        orders_db = s.db.rsplit("/", 1)[0] + "/" + orders_db_name
        env = oe.service_env(s, orders_db)
        api_port = int(env["CHARGED_API_URL"].rsplit(":", 1)[1])

        def cli(*args):
            r = subprocess.run([PYTHON, SERVICE] + list(args), env=env, capture_output=True,
                               timeout=60)
            check_eq(r.returncode, 0, "order_service %s exit (%s)" % (args[0], r.stderr[-500:]))

        def q(sql):
            return oe.rows(s, orders_db, sql)

        def charged_status(a):
            return s.query("SELECT status FROM payment_attempts WHERE id = '%s'" % a)[0][0]

        def resolve_failed():
            r = s.run([e2e.CHARGECTL, "attempt", "resolve", target, "--failed", "--force",
                       "--reason", "refunded by hand at the provider", "--actor", "dave"],
                      check=False)
            check_eq(r.returncode, 0, "chargectl attempt resolve --failed (%r)" %
                     r.stderr[-300:])
            check_eq(charged_status(target), "FAILED", "charged's status after resolve")

        def webhook(kind):
            st, doc = charged_api.post_webhook(api_port, charged_api.event(
                kind, {"id": target, "order_id": target_order, "amount": int(amount),
                       "currency": currency, "ppid": ppid}, created=int(time.time()) + 2))
            check_eq(st, 200, "the provider's %s webhook answered (%r)" % (kind, doc))
            e2e.wait_until("the target in REQUIRES_REVIEW after %s" % kind,
                           lambda: charged_status(target) == "REQUIRES_REVIEW",
                           e2e.scaled(30), 0.3)

        def service_sees(what, sql, want):
            e2e.wait_until("the service: %s" % what, lambda: q(sql) == want,
                           e2e.scaled(60), 0.3)

        def charges_of_order():
            ours = set(a for a, in q("SELECT payment_attempt_id FROM order_attempts WHERE "
                                     "order_id = '%s'" % target_order))
            return sorted(c["payment_attempt_id"] for c in s.ledger()
                          if c["outcome"] == "succeeded" and c["payment_attempt_id"] in ours)

        cli("init")
        s.start_worker()
        s.start_relay(RELAY_POLL_MS=100)
        p = subprocess.Popen([PYTHON, SERVICE, "run"], env=env,
                             stdout=open(os.path.join(s.dir, "order_service.log"), "ab"),
                             stderr=subprocess.STDOUT, start_new_session=True)
        cli("place-orders", "--count", "4")
        at_psp, paid = oe.wait_paid_as_charged(s, orders_db)
        check_eq(paid, at_psp, "orders paid = orders psp-sim charged, before the reversal")
        target_order, target = q(
            "SELECT o.order_id, o.paid_attempt_id FROM orders o WHERE paid AND NOT EXISTS "
            "(SELECT 1 FROM order_refunds r WHERE r.order_id = o.order_id) AND (SELECT "
            "count(*) FROM order_attempts a WHERE a.order_id = o.order_id) = 1 "
            "ORDER BY seq LIMIT 1")[0]
        ppid, amount, currency = s.query(
            "SELECT provider_payment_id, amount, currency FROM payment_attempts "
            "WHERE id = '%s'" % target)[0]
        e2e.log("target order %s, attempt %s, intent %s" % (target_order, target, ppid))
        check_eq(charges_of_order(), [target], "psp-sim's charges of the target order, first")

        # The reversal: the provider's failure after the success, a person's FAILED.
        webhook("payment_failed")
        resolve_failed()
        service_sees("the target order unpaid, payment_reversed",
                     "SELECT o.paid::text, (SELECT string_agg(kind, ',') FROM order_alarms a "
                     "WHERE a.order_id = o.order_id) FROM orders o WHERE order_id = '%s'"
                     % target_order, [["false", "payment_reversed"]])
        # A new attempt, had there been one, is written in the transaction
        # that applied the FAILED (attempt_failed): the count is final now.
        check_eq(q("SELECT count(*) FROM order_attempts WHERE order_id = '%s'" % target_order),
                 [["1"]], "attempts of the reversed order, after the reversal")

        # The status moves and comes back: the provider's success for the
        # same intent (REQUIRES_REVIEW), the person's FAILED again.
        webhook("succeeded")
        service_sees("the target's REQUIRES_REVIEW applied",
                     "SELECT applied_status FROM order_attempts WHERE payment_attempt_id = "
                     "'%s'" % target, [["REQUIRES_REVIEW"]])
        resolve_failed()
        service_sees("the target's FAILED applied again",
                     "SELECT applied_status FROM order_attempts WHERE payment_attempt_id = "
                     "'%s'" % target, [["FAILED"]])
        # As above: a second attempt would have been written with the FAILED.
        e2e.log("the service: order %s; attempts %s; alarms %s; psp-sim charges %s" % (
            q("SELECT paid, paid_attempt_id FROM orders WHERE order_id = '%s'" % target_order),
            q("SELECT attempt_no, payment_attempt_id, payment_method, applied_status FROM "
              "order_attempts WHERE order_id = '%s' ORDER BY attempt_no" % target_order),
            q("SELECT kind FROM order_alarms WHERE order_id = '%s'" % target_order),
            charges_of_order()))
        check_eq(q("SELECT count(*) FROM order_attempts WHERE order_id = '%s'" % target_order),
                 [["1"]], "attempts of the order a person reversed, after its FAILED came back")
        check_eq(charges_of_order(), [target],
                 "psp-sim's succeeded charges of the order a person reversed")
        check(p.poll() is None, "the order service exited on its own")
        p.send_signal(15)
        check_eq(p.wait(timeout=60), 0, "the order service's exit status on SIGTERM")
        p = None
    finally:
        e2e.stack_restore()
        if p is not None and p.poll() is None:
            os.killpg(p.pid, 9)
            p.wait()


if __name__ == "__main__":
    raise SystemExit(e2e.main(scenario))
