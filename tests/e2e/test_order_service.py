#!/usr/bin/env python3
"""examples/order_service applies every result event exactly once, while it
is SIGKILLed again and again.

A worker, a reconciler and a relay charge the service's orders against
psp-sim with faults (so attempts pass through UNKNOWN: two events for some).
The service consumes the results topic in its own database and is killed
with SIGKILL (its whole process group: psql and kcat too, so an open
transaction dies with it) at least three times while it applies events, and
restarted. Some events are also produced to the topic a second time, as a
relay killed between producing and marking would, refund events among
them. At the end: exactly one processed_events row per distinct event_id on
the topic, and exactly one paid mark per order whose attempt SUCCEEDED in
charged's payment_attempts, made by that attempt's charge.succeeded event.

Refunds: every REFUND_EVERY-th paid order (by placing order) is refunded,
in full or half, by the service itself; everything published again does not
make a second refund. At the end: one refund in charged per chosen paid
order and none for the others, each of the amount the service chose, its
last outcome in the service that of charged, and each order's refunded
total the sum of its SUCCEEDED refunds (a refund.succeeded delivered twice
counted once)."""
import json
import os
import random
import signal
import subprocess
import sys
import time

import charged_e2e as e2e
from charged_e2e import check, check_eq

HERE = os.path.dirname(os.path.abspath(__file__))
SERVICE = os.path.join(HERE, "..", "..", "examples", "order_service", "order_service.py")
sys.path.insert(0, os.path.dirname(SERVICE))
from order_service import REFUND_EVERY  # noqa: E402
N = 400
KILLS = 3


def scenario(new):
    s = new("order_service", psp_args=[
        "--latency-ms", "2", "--latency-jitter-ms", "8", "--fault", "drop_after=0.08",
        "--fault", "error_after=0.05", "--seed", str(random.randrange(1 << 30))])
    procs = {}
    try:
        run(s, procs)
    finally:
        for name, p in procs.items():
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGKILL)
                p.wait()


def run(s, procs):
    orders_db_name = s.tag.lower() + "_orders"
    s.psql(s.admin_db, 'CREATE DATABASE "%s"' % orders_db_name)
    orders_db = s.db.rsplit("/", 1)[0] + "/" + orders_db_name
    env = s.env({"ORDERS_DATABASE_URL": orders_db, "CHARGECTL": e2e.CHARGECTL})

    def service(*args, **kw):
        return subprocess.run([sys.executable, SERVICE] + list(args), env=env,
                              capture_output=True, **kw)

    def start_consumer(n):
        out = open(os.path.join(s.dir, "order_service_%d.log" % n), "ab")
        # Its own process group, so that a kill takes its psql and kcat along.
        procs["consumer"] = subprocess.Popen([sys.executable, SERVICE, "consume"], env=env,
                                             stdout=out, stderr=out, start_new_session=True)
        e2e.log("started order service consumer", n, "pid", procs["consumer"].pid)

    def processed():
        return int(s.psql(orders_db, "SELECT count(*) FROM processed_events").strip())

    p = service("init")
    check_eq(p.returncode, 0, "order_service init exit (%s)" % p.stderr.decode()[-500:])

    s.start_worker(WORKER_UNKNOWN_RETRIES=0, RECONCILER_FIRST_LOOK_MS=0)
    s.start_reconciler(RECONCILER_SCHEDULE_MS=200, RECONCILER_POLL_MS=100)
    relay_log = open(os.path.join(s.dir, "relay.log"), "ab")
    procs["relay"] = subprocess.Popen([e2e.CHARGED, "relay"], stdout=relay_log, stderr=relay_log,
                                      env=s.env({"WORKER_ID": "relay-os", "RELAY_POLL_MS": "100"}),
                                      start_new_session=True)
    start_consumer(0)
    # Orders arrive in waves, so that the consumer has work while it is killed.
    p = service("place-orders", "--count", str(N // 2))
    check_eq(p.returncode, 0, "place-orders exit (%s)" % p.stderr.decode()[-500:])

    kills, last, at_kill = 0, 0, []
    for k in range(KILLS):
        # Kill it while it applies: once it has moved on since the last kill.
        floor = last + random.randint(20, 60)
        e2e.wait_until("the consumer applying past %d events" % floor,
                       lambda: processed() >= floor, 120, 0.05)
        time.sleep(random.uniform(0, 0.3))
        os.killpg(procs["consumer"].pid, signal.SIGKILL)
        procs["consumer"].wait()
        last = processed()
        at_kill.append(last)
        kills += 1
        e2e.log("SIGKILLed the order service with %d events applied" % last)
        if k == 0:
            p = service("place-orders", "--count", str(N - N // 2))
            check_eq(p.returncode, 0, "place-orders exit (%s)" % p.stderr.decode()[-500:])
            # The producer's side of at-least-once: every attempt published again.
            p = service("publish", "--again")
            check_eq(p.returncode, 0, "publish --again exit (%s)" % p.stderr.decode()[-500:])
        start_consumer(k + 1)

    s.wait_settled(N, timeout=300)
    e2e.wait_until("nothing UNKNOWN or PROCESSING", lambda: s.query(
        "SELECT count(*) FROM payment_attempts WHERE status IN ('UNKNOWN','PROCESSING')")
        == [["0"]], 120)

    # The service refunds the chosen orders once it has applied their payment.
    n_succeeded = int(s.query("SELECT count(*) FROM payment_attempts WHERE status = "
                              "'SUCCEEDED'")[0][0])
    e2e.wait_until("every SUCCEEDED order paid in the service", lambda: int(s.psql(
        orders_db, "SELECT count(*) FROM orders WHERE paid").strip()) == n_succeeded, 120, 0.2)
    chosen = int(s.psql(orders_db, "SELECT count(*) FROM orders WHERE paid AND seq %% %d = 0"
                        % REFUND_EVERY).strip())
    check(chosen >= 10, "only %d orders chosen for a refund" % chosen)
    e2e.wait_until("the service's refunds published", lambda: s.psql(
        orders_db, "SELECT count(*), count(*) FILTER (WHERE published) FROM order_refunds"
    ).strip() == "%d|%d" % (chosen, chosen), 60, 0.2)
    s.wait_refunds_settled(chosen, 120)
    # The producer's side again, refunds included: the same refunds, not new ones.
    p = service("publish", "--again")
    check_eq(p.returncode, 0, "publish --again exit (%s)" % p.stderr.decode()[-500:])
    e2e.wait_until("every command consumed", lambda: s.lag()["lag"] == 0, 60)
    s.wait_refunds_settled(chosen, 60)
    e2e.wait_until("every outbox row published", lambda: s.query(
        "SELECT count(*) FROM outbox WHERE published_at IS NULL") == [["0"]], 120)
    s.check_invariants()
    s.check_refund_invariants()

    # A relay's duplicates: some events again, succeeded ones among them.
    msgs = [json.loads(l) for l in s.tool("dump", s.topics["results"]).splitlines() if l.strip()]
    succ = [m for m in msgs if json.loads(m["value"])["type"] == "charge.succeeded"]
    refunded = [m for m in msgs if json.loads(m["value"])["type"] == "refund.succeeded"]
    check(len(refunded) >= 5, "only %d refund.succeeded events" % len(refunded))
    again = random.sample(succ, 15) + random.sample(refunded, 5) + random.sample(msgs, 15)
    s.tool("produce", s.topics["results"], stdin="".join(json.dumps(
        {"key": m["key"], "value": m["value"], "headers": m["headers"]}) + "\n"
        for m in again).encode())
    msgs = [json.loads(l) for l in s.tool("dump", s.topics["results"]).splitlines() if l.strip()]
    ends = {}
    for m in msgs:
        ends[m["partition"]] = max(ends.get(m["partition"], 0), m["offset"] + 1)

    def caught_up():
        rows = s.psql(orders_db, "SELECT kafka_partition, next_offset FROM consumer_positions")
        got = dict((int(a), int(b)) for a, b in (l.split("|") for l in rows.split()))
        return all(got.get(p, 0) >= e for p, e in ends.items())
    e2e.wait_until("the order service at the end of every partition", caught_up, 120, 0.2)
    procs["consumer"].send_signal(signal.SIGTERM)
    procs["consumer"].wait()

    events = {}
    for m in msgs:
        ev = json.loads(m["value"])
        events[ev["event_id"]] = ev
    rows = s.psql(orders_db, "SELECT event_id, count(*) FROM processed_events GROUP BY 1").split()
    counts = dict((a, int(b)) for a, b in (r.split("|") for r in rows))
    check_eq(sorted(counts), sorted(events), "event_ids in processed_events against the topic")
    check(all(n == 1 for n in counts.values()), "an event processed twice")
    check(len(msgs) > len(events), "no duplicate on the topic: the dedupe was not exercised")

    succeeded = dict((r[1], r[0]) for r in s.query(
        "SELECT id, order_id FROM payment_attempts WHERE status = 'SUCCEEDED'"))
    succ_event = dict((ev["payment_attempt_id"], ev["event_id"]) for ev in events.values()
                      if ev["type"] == "charge.succeeded")
    rows = s.psql(orders_db, "SELECT order_id, paid_attempt_id, paid_event_id FROM orders "
                  "WHERE paid").split()
    paid = dict((r.split("|")[0], r.split("|")[1:]) for r in rows)
    check_eq(sorted(paid), sorted(succeeded), "orders marked paid against SUCCEEDED orders")
    for order, (attempt, event) in paid.items():
        check_eq(attempt, succeeded[order], "attempt that paid order %s" % order)
        check_eq(event, succ_event.get(attempt), "event that paid order %s" % order)
    n_orders = int(s.psql(orders_db, "SELECT count(*) FROM orders").strip())
    check_eq(n_orders, N, "orders of the service")
    check_refunds(s, orders_db, events)
    e2e.log("order service: %d messages, %d distinct events, each applied once; %d of %d "
            "orders paid, each once; %d SIGKILLs" % (len(msgs), len(events), len(paid), N, kills))
    check(kills >= 2, "fewer than two kills")
    check(all(n < len(events) for n in at_kill),
          "a kill came after the consumer had applied everything: %s" % at_kill)


def check_refunds(s, orders_db, events):
    """The service's refunds against charged's and the events on the topic."""
    rows = s.psql(orders_db, "SELECT o.order_id, o.seq, o.amount, o.paid, o.paid_attempt_id, "
                  "o.refunded_amount, r.refund_id, r.payment_attempt_id, r.amount, "
                  "coalesce(r.last_event_type, ''), coalesce(r.succeeded_event_id::text, '') "
                  "FROM orders o LEFT JOIN order_refunds r USING (order_id)").split()
    charged = dict((r[0], r) for r in s.query(
        "SELECT id, payment_attempt_id, order_id, amount, status FROM refund_attempts"))
    ours = set()
    totals = {}
    full = partial = 0
    for row in rows:
        (order, seq, amount, paid, attempt, refunded, refund, r_attempt, r_amount, last,
         succ_event) = row.split("|")
        want = paid == "t" and int(seq) % REFUND_EVERY == 0
        check(bool(refund) == want, "order %s (seq %s, paid %s) has refund %r" % (
            order, seq, paid, refund))
        totals[order] = int(refunded)
        if not refund:
            check_eq(int(refunded), 0, "refunded total of unrefunded order %s" % order)
            continue
        ours.add(refund)
        full_refund = int(seq) % (2 * REFUND_EVERY) == 0
        full, partial = full + full_refund, partial + (not full_refund)
        check_eq(int(r_amount), int(amount) if full_refund else int(amount) // 2,
                 "amount of refund %s" % refund)
        check_eq(r_attempt, attempt, "attempt refunded by %s" % refund)
        c = charged.get(refund)
        check(c is not None, "refund %s unknown to charged" % refund)
        check_eq((c[1], c[2], int(c[3])), (attempt, order, int(r_amount)),
                 "charged's refund %s" % refund)
        check_eq(last, "refund." + c[4].lower(),
                 "last refund event applied for %s" % refund)
        want_total = int(r_amount) if c[4] == "SUCCEEDED" else 0
        check_eq(int(refunded), want_total, "refunded total of order %s" % order)
        if c[4] == "SUCCEEDED":
            ev = events.get(succ_event)
            check(ev is not None and ev["type"] == "refund.succeeded" and
                  ev["refund_id"] == refund, "event that counted refund %s" % refund)
    check_eq(sorted(charged), sorted(ours), "charged's refunds against the service's")
    check(full and partial, "full refunds %d, partial %d" % (full, partial))
    outcomes = {}
    for c in charged.values():
        outcomes[c[4]] = outcomes.get(c[4], 0) + 1
    e2e.log("order service refunds: %d (%d full, %d partial), %s; %d refunded in all" % (
        len(ours), full, partial, outcomes, sum(totals.values())))


if __name__ == "__main__":
    raise SystemExit(e2e.main(scenario))
