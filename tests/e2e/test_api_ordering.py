"""Webhooks and workers racing on real Kafka, PostgreSQL and psp-sim, which
delivers its own signed events:

1. webhook first: psp-sim charges, then holds the worker's answer longer
   than the worker waits; its webhook arrives while charged holds no
   intent of the attempt's own yet. The event only names the attempt
   (metadata is anyone's to write, issue 34): it is unproven, never
   applied, and pages no one (ChargedWebhookFlagged is for evidence that
   contradicts an attempt, not for a webhook that outran our answer); the
   attempt is settled on the answer under its own key (the worker's retry
   or the reconciler's replay).
2. worker first: the api is down while the worker settles; psp-sim keeps
   redelivering until the api is up, and the event changes nothing.
3. both at once, many times: duplicated and reordered deliveries while
   workers charge successes, declines and slow (processing) payments.

Each ends with one SUCCEEDED (or FAILED) per attempt, one ledger row per
success, one result event per settlement, and psp-sim charged each key once.
"""

import charged_api as api
import charged_e2e as e2e
from charged_e2e import check, check_eq


def settled_by(s, attempt_id):
    """Causes of the moves into a settled state of one attempt."""
    return s.query("SELECT cause, new_status FROM attempt_transitions WHERE payment_attempt_id "
                   "= '%s' AND new_status IN ('SUCCEEDED', 'FAILED', 'REQUIRES_REVIEW') ORDER BY id"
                   % attempt_id)


def one_each(s):
    """One ledger row per SUCCEEDED attempt and none otherwise; one result
    event per settled attempt."""
    rows = s.query(
        "SELECT a.id, a.status, (SELECT count(*) FROM ledger_entries l WHERE l.payment_attempt_id = a.id),"
        " (SELECT count(*) FROM outbox o WHERE o.payment_attempt_id = a.id AND o.event_type IN "
        "  ('charge.succeeded', 'charge.failed'))"
        " FROM payment_attempts a")
    for aid, status, ledger, events in rows:
        want = (1 if status == "SUCCEEDED" else 0, 1 if status in ("SUCCEEDED", "FAILED") else 0)
        check_eq((int(ledger), int(events)), want, "ledger rows and result events of %s %s" % (status, aid))
    return rows


def webhook_first(make):
    port = e2e.free_port()
    s = make("api_order_webhook_first", partitions=1,
             psp_args=api.psp_webhook_args(port) + ["--fault", "stall_after=1#1", "--stall-ms", "8000"],
             worker_env={"RECONCILER_FIRST_LOOK_MS": "500"})
    api.start_api(s, port=port)
    s.start_worker()
    s.start_reconciler(RECONCILER_POLL_MS="100", RECONCILER_SCHEDULE_MS="500")
    cmd = e2e.new_command()
    s.publish([cmd])
    aid = cmd["payment_attempt_id"]
    e2e.wait_until("the webhook recorded", lambda: api.webhook_rows(s), 30)
    check_eq(set(api.webhook_rows(s).values()), {"unproven"},
             "outcome of the event that arrived before the attempt's own answer")
    e2e.wait_until("the attempt settled",
                   lambda: settled_by(s, aid) and settled_by(s, aid)[-1][1] == "SUCCEEDED", 60)
    s.wait_settled(1, 60)
    by = settled_by(s, aid)
    check(len(by) == 1 and by[0][0] in ("worker", "reconciler"),
          "who settled it, in the end (never the webhook): %s" % by)
    one_each(s)
    s.check_invariants()
    check_eq(len(s.ledger()), 1, "charges at the provider")


def worker_first(make):
    port = e2e.free_port()
    s = make("api_order_worker_first", partitions=1, psp_args=api.psp_webhook_args(port))
    s.start_worker()
    cmd = e2e.new_command()
    s.publish([cmd])
    aid = cmd["payment_attempt_id"]
    s.wait_settled(1, 60)
    check_eq(settled_by(s, aid), [["worker", "SUCCEEDED"]], "who settled it")
    e2e.wait_until("psp-sim retrying its undelivered event",
                   lambda: s.psp_get("/webhooks").get("failures", 0) >= 1, 20)
    api.start_api(s, port=port)
    e2e.wait_until("the event delivered",
                   lambda: api.webhook_rows(s) and s.psp_get("/webhooks").get("pending") == 0, 30)
    outcomes = set(api.webhook_rows(s).values())
    check_eq(outcomes, {"ignored"}, "outcome of the late event")
    check_eq(settled_by(s, aid), [["worker", "SUCCEEDED"]], "who settled it, after the event")
    one_each(s)
    s.check_invariants()


def both_at_once(make):
    port = e2e.free_port()
    s = make("api_order_mixed", partitions=4,
             psp_args=api.psp_webhook_args(port) + [
                 "--webhook-duplicate-rate", "0.5", "--webhook-reorder-rate", "0.3",
                 "--processing-settle-ms", "1500", "--seed", "7"])
    api.start_api(s, port=port)
    api.start_api(s, port=None)  # a second api, idle: two processes may share the database
    s.start_worker()
    s.start_worker()
    s.start_reconciler(RECONCILER_POLL_MS="500")
    methods = ["pm_card_visa"] * 6 + ["pm_card_processing"] * 3 + ["pm_card_chargeDeclined"]
    cmds = [e2e.new_command(payment_method=methods[i % len(methods)]) for i in range(60)]
    s.publish(cmds)
    s.wait_settled(len(cmds), 120)
    e2e.wait_until("every attempt settled",
                   lambda: not s.query("SELECT 1 FROM payment_attempts WHERE status IN "
                                       "('PENDING', 'PROCESSING', 'UNKNOWN')"), 60)
    e2e.wait_until("every event delivered", lambda: s.psp_get("/webhooks").get("pending") == 0, 60)
    stats = s.psp_get("/webhooks")
    e2e.log("psp-sim webhooks:", stats)
    check(stats.get("duplicates", 0) > 0, "psp-sim sent no duplicate: %r" % stats)
    rows = one_each(s)
    by = {}
    for r in rows:
        by[r[1]] = by.get(r[1], 0) + 1
    check_eq(by.get("SUCCEEDED", 0), 54, "SUCCEEDED attempts (visa and processing)")
    check_eq(by.get("FAILED", 0), 6, "FAILED attempts (declined)")
    counts = s.check_invariants()
    causes = s.query("SELECT cause, count(*) FROM attempt_transitions WHERE new_status = 'SUCCEEDED' "
                     "GROUP BY 1")
    e2e.log("successes by cause:", causes)
    check_eq(sum(int(c[1]) for c in causes), 54, "moves into SUCCEEDED")
    check("webhook" in dict(causes), "no attempt was settled by a webhook: %r" % causes)
    outcomes = {}
    for o in api.webhook_rows(s).values():
        outcomes[o] = outcomes.get(o, 0) + 1
    e2e.log("webhook outcomes:", outcomes, "attempts:", counts)
    # unproven: psp-sim's success arrived before the attempt's own answer was
    # in; it only named the attempt and was never applied (issue 34). Never
    # flagged: that pages, and nothing here contradicts an attempt.
    check_eq({k for k in outcomes if k not in ("applied", "ignored", "unproven")}, set(),
             "outcomes other than applied, ignored or unproven")


def scenario(make):
    webhook_first(make)
    worker_first(make)
    both_at_once(make)


if __name__ == "__main__":
    raise SystemExit(e2e.main(scenario))
