#!/usr/bin/env python3
"""One attempt's result events reach the results topic in the order of its
transitions, whatever the writers' transactions began with.

The race an outside attack found, forced step by step: the provider charges
but holds its answer (psp-sim stall_after); the api receives the
payment_intent.succeeded webhook and begins its transaction, and is held
there before it locks the attempt (a session of the test holds the
processed_webhook_events row of that event id); meanwhile the worker's call
times out and it commits UNKNOWN. Then the test lets the api go. The event's
intent only names the attempt (charged recorded none of its own: the
answer was lost), so since issue 34 the api never applies it: it records it
unproven and, in the same transaction, makes the UNKNOWN attempt due for the
reconciler at once (RECONCILER_FIRST_LOOK_MS is 10 minutes here). A
reconciler then settles SUCCEEDED on the replay under the attempt's key.
Only then does a relay start, so that its order alone decides.
(The api waits less than its lock_timeout of 5 s: the worker's answer is
lost after 1 s, its call times out after 3 s at the latest.)

A writer that stamps its event when its transaction began (now()) stamped
SUCCEEDED before UNKNOWN, and the relay published charge.succeeded first:
the order service's last word on a paid order was charge.unknown. Checked
against the attempt's transitions (their ids are drawn in commit order
under the row lock), never against any timestamp; and occurred_at and the
status API's updated_at never go backwards."""
import json
import threading
import uuid

import charged_api as api
import charged_e2e as e2e
from charged_e2e import check, check_eq

EVENT_OF = {"UNKNOWN": "charge.unknown", "SUCCEEDED": "charge.succeeded",
            "FAILED": "charge.failed", "REJECTED": "charge.rejected",
            "REQUIRES_REVIEW": "charge.requires_review"}
ENV = {"WORKER_UNKNOWN_RETRIES": "0", "PROVIDER_TIMEOUT_MS": "3000",
       "WORKER_LEASE_MS": "20000", "RECONCILER_FIRST_LOOK_MS": "600000"}


def topic_types(s, attempt_id):
    """The types of attempt_id's events on the results topic, in partition
    order, each event_id once."""
    msgs = [json.loads(l) for l in s.tool("dump", s.topics["results"]).splitlines() if l.strip()]
    seen, out = set(), []
    for m in sorted(msgs, key=lambda m: (m["partition"], m["offset"])):
        if m["key"] != attempt_id:
            continue
        v = json.loads(m["value"])
        if v["event_id"] in seen:
            continue
        seen.add(v["event_id"])
        out.append(v)
    return out


def scenario(new):
    s = new("event_order", partitions=3, psp_args=["--stall-ms", "1000"], worker_env=ENV)
    _, port = api.start_api(s)
    w = s.start_worker()
    e2e.wait_until("worker ready", lambda: s.admin_get(w, "/readyz")[0] == 200, 60)

    cmd = e2e.new_command()
    aid = cmd["payment_attempt_id"]
    event_id = "evt_" + uuid.uuid4().hex
    hold = e2e.Session(s.db)
    hold.run("BEGIN")
    hold.run("INSERT INTO processed_webhook_events (provider, event_id, event_type, outcome,"
             " payload) VALUES ('stripe', '%s', 'payment_intent.succeeded', 'received', '{}')"
             % event_id)
    s.psp_put("/faults", {"rules": [{"kind": "stall_after", "key": cmd["idempotency_key"],
                                     "times": 1}]})
    s.publish([cmd])
    charge = e2e.wait_until("psp-sim to charge (and hold its answer)", lambda: [
        c for c in s.ledger() if c["payment_attempt_id"] == aid], 30)[0]

    attempt = {"id": aid, "order_id": cmd["order_id"], "amount": cmd["amount"],
               "currency": cmd["currency"]}
    ev = api.event("succeeded", attempt, intent=charge["payment_intent_id"], event_id=event_id)
    answer = {}
    t = threading.Thread(target=lambda: answer.update(r=api.post_webhook(port, ev)))
    t.start()
    try:
        # The api began its transaction and waits for the test's session.
        e2e.wait_until("the api's transaction to wait for the held event row", lambda: s.query(
            "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database()"
            " AND wait_event_type = 'Lock' AND pid <> %d"
            " AND query LIKE '%%processed_webhook_events%%'" % hold.pid) == [["1"]], 30)
        # Meanwhile the worker's call times out: it commits UNKNOWN.
        e2e.wait_until("the worker to commit UNKNOWN", lambda: s.query(
            "SELECT status FROM payment_attempts WHERE id = '%s'" % aid) == [["UNKNOWN"]], 60)
    finally:
        hold.run("ROLLBACK")
        hold.close()
        t.join(e2e.scaled(60))
    check(not t.is_alive(), "the webhook was never answered")
    check_eq(answer["r"][0], 200, "webhook status")
    check_eq(answer["r"][1].get("result"), "unproven", "webhook result (%s)" % answer["r"][1])
    check_eq(s.query("SELECT status, next_check_at <= now() FROM payment_attempts"
                     " WHERE id = '%s'" % aid), [["UNKNOWN", "t"]],
             "the attempt after the event that only names it: due for the reconciler")
    s.start_reconciler(RECONCILER_POLL_MS="100", RECONCILER_SCHEDULE_MS="500")
    e2e.wait_until("the reconciler to settle the attempt", lambda: s.query(
        "SELECT status FROM payment_attempts WHERE id = '%s'" % aid) == [["SUCCEEDED"]], 60)

    transitions = [r[0] for r in s.query(
        "SELECT new_status FROM attempt_transitions WHERE payment_attempt_id = '%s'"
        " ORDER BY id" % aid)]
    check_eq(transitions, ["PROCESSING", "UNKNOWN", "SUCCEEDED"], "transitions")
    want = [EVENT_OF[t] for t in transitions if t in EVENT_OF]

    # Only now does a relay publish: its order alone decides the topic's.
    s.start_relay(RELAY_POLL_MS="100")
    e2e.wait_until("every outbox row published", lambda: s.query(
        "SELECT count(*) FROM outbox WHERE published_at IS NULL") == [["0"]], 60)
    events = topic_types(s, aid)
    check_eq([e["type"] for e in events], want,
             "event types on the topic in partition order (the transitions' order)")
    stamps = [e["occurred_at"] for e in events]
    check(stamps == sorted(stamps), "occurred_at goes backwards along the topic: %s" % stamps)
    st, doc = api.get(port, "/v1/payment-attempts/%s" % aid)
    check_eq(st, 200, "status query")
    check_eq(doc["status"], "SUCCEEDED", "status")
    check(doc["updated_at"] >= stamps[-1] and doc["updated_at"] >= stamps[0],
          "updated_at %s is older than the events %s" % (doc["updated_at"], stamps))
    s.check_invariants()


if __name__ == "__main__":
    raise SystemExit(e2e.main(scenario))
