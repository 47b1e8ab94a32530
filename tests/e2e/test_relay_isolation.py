#!/usr/bin/env python3
"""One outbox row never stops the others, and no writer can address an event
to a topic nobody publishes to.

1. mistyped topic: a worker and an api whose CHARGE_RESULTS_TOPIC has a
   typo, and an outbox row an older writer addressed to a topic that does
   not exist. Every event still reaches the relay's own results topic, and
   the relay stays ready. (The writers' topic went into the row; the relay
   published there, "Unknown topic" for good, and no later event left.)
2. one event the broker refuses (larger than the producer's limit) among
   others: the others are published at once, the refused one waits with a
   back-off and holds back only the later events of its own attempt; the
   relay stays ready and counts the failure.
3. a relay whose own CHARGE_RESULTS_TOPIC does not exist is not ready, and
   says which topic.
4. the broker (not the producer) refuses an attempt's first event: its
   second event never reaches the topic before it, however many times the
   first is tried. (Both used to be produced in one batch: the broker took
   the second and refused the first, and the second was produced again at
   every try.)
5. a batch stops waiting for an acknowledgement (RELAY_ACK_TIMEOUT_MS); the
   late report of that message must not mark another event of the next
   batch published. (It came back by its index in the old batch, marked an
   event the broker never had, and a relay crash then lost that event.)
   Slowness by legal settings only: KAFKA_LINGER_MS longer than the wait."""
import json
import os
import signal
import uuid
import zlib

import charged_api as api
import charged_e2e as e2e
from charged_e2e import check, check_eq


def on_topic(s):
    """{event_id: message} on the scenario's results topic."""
    msgs = [json.loads(l) for l in s.tool("dump", s.topics["results"]).splitlines() if l.strip()]
    return dict((dict((h[0], h[1]) for h in m["headers"])["event_id"], m) for m in msgs)


def unpublished(s):
    return int(s.query("SELECT count(*) FROM outbox WHERE published_at IS NULL")[0][0])


def add_event(s, attempt_id, payload_sql, topic):
    """An outbox row written by hand, as an older or other writer would;
    its event_id."""
    return s.query(
        "INSERT INTO outbox (event_id, payment_attempt_id, event_type, topic, event_key, payload)"
        " SELECT e, '{0}', 'charge.unknown', '{2}', '{0}', {1}"
        " FROM (SELECT gen_random_uuid() AS e) g RETURNING event_id"
        .format(attempt_id, payload_sql.replace("EID", "e"), topic))[0][0]


def mistyped_topic(new):
    typo = "payments.charge.reslts"
    s = new("relay_typo", partitions=3, worker_env={"CHARGE_RESULTS_TOPIC": typo})
    _, port = api.start_api(s)
    s.start_worker()
    cmds = [e2e.new_command() for _ in range(10)]
    s.publish(cmds)
    s.wait_settled(len(cmds), 60)
    # A webhook applied by an api with the same typo.
    # Its intent recorded from its own call's answer: only that moves it.
    a = api.insert_attempt(s, "UNKNOWN", ppid="pi_relay_typo_0001")
    st, doc = api.post_webhook(port, api.event("succeeded", a))
    check_eq((st, doc.get("result")), (200, "applied"), "webhook")
    old = add_event(s, a["id"], "jsonb_build_object('event_id', EID, 'type', 'charge.unknown')",
                    "no.such.topic")
    relay = s.start_relay(CHARGE_RESULTS_TOPIC=s.topics["results"], RELAY_POLL_MS="100")
    e2e.wait_until("every outbox row published", lambda: unpublished(s) == 0, 60)
    events = [r[0] for r in s.query("SELECT event_id FROM outbox")]
    got = on_topic(s)
    check_eq(sorted(e for e in events if e not in got), [], "events missing from the results topic")
    check(old in got, "the old writer's row did not reach the results topic")
    check_eq(len(events), 12, "events written (10 charges, 1 webhook, 1 by hand)")
    check_eq(s.admin_get(relay, "/readyz")[0], 200, "relay readiness")


def refused_event(new):
    s = new("relay_refused", partitions=3)
    relay = s.start_relay(RELAY_POLL_MS="100")
    # Attempt x has a first event larger than the producer takes (4 MiB),
    # then a second one; both are written before anything else.
    x = api.insert_attempt(s, "UNKNOWN")
    big = add_event(s, x["id"], "jsonb_build_object('event_id', EID, 'pad', repeat('x', 5000000))",
                    s.topics["results"])
    after_big = add_event(s, x["id"], "jsonb_build_object('event_id', EID, 'type', 'second')",
                          s.topics["results"])
    s.start_worker()
    cmds = [e2e.new_command() for _ in range(20)]
    s.publish(cmds)
    s.wait_settled(len(cmds), 60)
    e2e.wait_until("the 20 charges' events published past the refused one", lambda: int(s.query(
        "SELECT count(*) FROM outbox WHERE published_at IS NOT NULL AND payment_attempt_id"
        " <> '%s'" % x["id"])[0][0]) == 20, 60)
    rows = s.query("SELECT event_id, published_at IS NULL, publish_failures > 0, retry_at > now(),"
                   " last_error FROM outbox WHERE payment_attempt_id = '%s'" % x["id"])
    state = dict((r[0], r[1:]) for r in rows)
    check_eq(state[big][:2], ["t", "t"], "the refused event: unpublished, failure counted")
    check(state[big][3], "no error kept for the refused event: %s" % state[big])
    check_eq(state[after_big][:2], ["t", "f"], "the next event of its attempt waits, untried")
    got = on_topic(s)
    check(big not in got and after_big not in got, "attempt x's events overtook each other")
    check_eq(s.admin_get(relay, "/readyz")[0], 200, "relay readiness with one refused event")
    m = s.admin_metrics(relay)
    check(m.get("charged_outbox_publish_failures_total", 0) >= 1,
          "charged_outbox_publish_failures_total: %s" % m.get("charged_outbox_publish_failures_total"))
    check(s.worker_log(relay, "result events not acknowledged"),
          "no log line for the refused event")


def missing_own_topic(new):
    s = new("relay_no_topic", partitions=3)
    api.insert_attempt(s, "UNKNOWN")
    a = api.insert_attempt(s, "UNKNOWN")
    add_event(s, a["id"], "jsonb_build_object('event_id', EID)", s.topics["results"])
    relay = s.start_relay(CHARGE_RESULTS_TOPIC="e2e.no.such.results.topic", RELAY_POLL_MS="100")
    e2e.wait_until("the relay to log the refusal", lambda: s.worker_log(
        relay, "result events not acknowledged"), 120)
    e2e.wait_until("the relay not ready", lambda: s.admin_get(relay, "/readyz")[0] == 503, 30)
    status, body = s.admin_get(relay, "/readyz")
    check("broker not acknowledging" in body, "readiness reason: %s" % body)
    line = s.worker_log(relay, "result events not acknowledged")[-1]
    check_eq(line.get("topic"), "e2e.no.such.results.topic", "topic named in the log line")
    check_eq(unpublished(s), 1, "events marked published")


def published_not_on_topic(s):
    got = on_topic(s)
    return sorted(r[0] for r in s.query("SELECT event_id FROM outbox WHERE published_at IS NOT NULL")
                  if r[0] not in got)


def broker_refuses_first(new):
    s = new("relay_broker_refused", partitions=3)
    # Key, value and header 60 bytes under the 4 MiB the producer checks
    # (deploy/stack.sh sets the same limit on the broker): the producer
    # takes it, and the broker refuses it once the record batch's own bytes
    # are added.
    x = api.insert_attempt(s, "UNKNOWN")
    first = add_event(s, x["id"], "jsonb_build_object('event_id', EID, 'pad', '')",
                      s.topics["results"])
    bare = int(s.query("SELECT length(payload::text) FROM outbox WHERE event_id = '%s'"
                       % first)[0][0])
    pad = 4194304 - 60 - 36 - (len("event_id") + 36) - bare
    s.query("UPDATE outbox SET payload = jsonb_build_object('event_id', event_id, 'pad',"
            " repeat('x', %d)) WHERE event_id = '%s' RETURNING 1" % (pad, first))
    y = api.insert_attempt(s, "UNKNOWN")
    other = add_event(s, y["id"], "jsonb_build_object('event_id', EID, 'type', 'other')",
                      s.topics["results"])
    second = add_event(s, x["id"], "jsonb_build_object('event_id', EID, 'type', 'second')",
                       s.topics["results"])
    relay = s.start_relay(RELAY_POLL_MS="100")
    e2e.wait_until("the refused first event tried three times", lambda: int(s.query(
        "SELECT publish_failures FROM outbox WHERE event_id = '%s'" % first)[0][0]) >= 3, 60)
    got = on_topic(s)
    check(other in got, "another attempt's event was held back")
    check(first not in got, "the refused event is on the topic")
    check(second not in got, "the second event of the attempt overtook its refused first")
    check_eq(s.query("SELECT published_at IS NULL FROM outbox WHERE event_id = '%s'" % second),
             [["t"]], "the second event, unpublished")
    check_eq(published_not_on_topic(s), [], "rows marked published but not on the topic")
    check_eq(s.admin_get(relay, "/readyz")[0], 200, "relay readiness")


def attempt_in(s, partition, partitions=3):
    """An UNKNOWN attempt whose key librdkafka's default partitioner (crc32
    of the key) puts on `partition`."""
    while True:
        aid = str(uuid.uuid4())
        if zlib.crc32(aid.encode()) % partitions == partition:
            break
    s.psql(s.db, "INSERT INTO payment_attempts (id, order_id, idempotency_key,"
           " request_fingerprint, amount, currency, payment_method, status, first_sent_at)"
           " VALUES ('%s', gen_random_uuid(), 'key-%s', 'fp', 100, 'EUR', 'pm_card_visa',"
           " 'UNKNOWN', now())" % (aid, aid))
    return aid


def small(s, aid, kind):
    return add_event(s, aid, "jsonb_build_object('event_id', EID, 'type', '%s')" % kind,
                     s.topics["results"])


def late_report(new):
    s = new("relay_late_report", partitions=3)
    # A message alone in its partition lingers 4 s, longer than the batch
    # waits (2 s); two in one partition are sent at once.
    slow = {"RELAY_POLL_MS": "100", "RELAY_ACK_TIMEOUT_MS": "2000",
            "KAFKA_LINGER_MS": "4000", "KAFKA_MESSAGE_TIMEOUT_MS": "30000",
            "KAFKA_BATCH_NUM_MESSAGES": "2"}
    x1 = small(s, attempt_in(s, 0), "x1")
    small(s, attempt_in(s, 1), "y1")
    small(s, attempt_in(s, 1), "z1")
    relay = s.start_relay(**slow)
    e2e.wait_until("x1 given up on by its batch", lambda: s.query(
        "SELECT publish_failures > 0 FROM outbox WHERE event_id = '%s'" % x1) == [["t"]], 30)
    w1 = small(s, attempt_in(s, 2), "w1")
    # x1's late report arrives while w1's batch waits, at the index w1 has.
    e2e.wait_until("w1's batch over (published or given up on)", lambda: s.query(
        "SELECT published_at IS NOT NULL OR publish_failures > 0 FROM outbox"
        " WHERE event_id = '%s'" % w1) == [["t"]], 30)
    check_eq(published_not_on_topic(s), [], "rows marked published but not on the topic")
    s.relays[relay].send_signal(signal.SIGKILL)
    s.relays[relay].wait()
    s.start_relay(RELAY_POLL_MS="100")
    e2e.wait_until("every outbox row published", lambda: unpublished(s) == 0, 90)
    check_eq(published_not_on_topic(s), [], "rows marked published but never on the topic")


def scenario(new):
    only = os.environ.get("RELAY_CASE")
    for case in (mistyped_topic, refused_event, missing_own_topic, broker_refuses_first,
                 late_report):
        if not only or only == case.__name__:
            e2e.log("== case", case.__name__)
            case(new)


if __name__ == "__main__":
    raise SystemExit(e2e.main(scenario))
