#!/usr/bin/env python3
"""examples/order_service, the service a payments team would copy, under
the faults charged survives: every result event takes effect exactly once,
every order is paid at most once, and the service never exits on its own.

A worker, a reconciler, a relay and the api charge the service's orders
against psp-sim with faults (answers lost after charging, 5xx after it), so
that attempts pass through UNKNOWN; the reconciler looks late, so that the
service polls the api for them meanwhile. One order in nine is declined at
first, and the service tries it once more with another card. Every fifth
paid order is refunded, in full or half. While orders arrive in waves the
service (run with deploy/.tools' python: confluent-kafka and psycopg) is
SIGKILLed three times, a second instance joins its consumer group and
leaves it (SIGTERM) again, the broker is killed and started again, PostgreSQL
is stopped as if it crashed and started again, every command is marked
unsent (what a crash between send and mark leaves) and sent again, and
result events are produced a second time, as a relay killed between
producing and marking would.

At the end, from charged's tables, psp-sim's ledger and the topics:
- exactly one processed_events row per distinct event_id on the results
  topic; each order paid by its SUCCEEDED attempt, once charged's api said
  so; each refunded total the sum of its SUCCEEDED refunds;
- at most one charge per order at psp-sim (and one per key);
- one attempt in charged per attempt of the service, although every
  command went out at least twice; a second attempt (new id, new key) for
  each order whose first was FAILED, none for the others;
- the status polls saw what charged says;
- the service's exits: only the ones this test caused (counted), and a
  SIGTERM exits 0 (the second instance's, and the first's at the end)."""
import json
import os
import random
import signal
import subprocess
import sys
import time

import charged_api
import charged_e2e as e2e
from charged_e2e import check, check_eq

HERE = os.path.dirname(os.path.abspath(__file__))
SOURCE = os.environ.get("CHARGED_SOURCE_DIR") or os.path.join(HERE, "..", "..")
SERVICE = os.path.join(SOURCE, "examples", "order_service", "order_service.py")
# The service's python: deploy/install-deps.sh's virtual environment.
PYTHON = os.environ.get("ORDER_SERVICE_PYTHON",
                        os.path.join(SOURCE, "deploy", ".tools", "bin", "python"))
sys.path.insert(0, os.path.dirname(SERVICE))
from refund_policy import refund_for  # noqa: E402
WAVES = (50, 30, 30, 30)
TERMINAL = ("SUCCEEDED", "FAILED", "REJECTED", "REQUIRES_REVIEW")


class Service:
    """One instance of the order service, kept running; counts the exits it
    was not asked for."""

    def __init__(self, s, env, name="order_service"):
        self.s, self.env, self.name, self.p, self.n = s, env, name, None, 0
        self.own_exits = []

    def log_path(self):
        return os.path.join(self.s.dir, "%s_%d.log" % (self.name, self.n))

    def start(self):
        self.n += 1
        out = open(self.log_path(), "ab")
        self.p = subprocess.Popen([PYTHON, SERVICE, "run"], env=self.env, stdout=out,
                                  stderr=out, start_new_session=True)
        e2e.log("started", self.name, self.n, "pid", self.p.pid)

    def terminate(self):
        """SIGTERM: it finishes its batch and exits 0."""
        self.watch()
        self.p.send_signal(signal.SIGTERM)
        check_eq(self.p.wait(timeout=30), 0, "%s's exit status on SIGTERM" % self.name)
        self.p = None

    def watch(self):
        """Notes an exit nobody caused, and starts it again."""
        if self.p is not None and self.p.poll() is not None:
            self.own_exits.append((self.n, self.p.returncode))
            e2e.log("the order service exited on its own:", self.p.returncode)
            self.start()

    def kill(self):
        self.watch()
        os.killpg(self.p.pid, signal.SIGKILL)
        self.p.wait()
        self.start()

    def close(self):
        if self.p is not None and self.p.poll() is None:
            os.killpg(self.p.pid, signal.SIGKILL)
            self.p.wait()


def scenario(new):
    s = new("order_service", psp_args=[
        "--latency-ms", "2", "--latency-jitter-ms", "8", "--fault", "drop_after=0.08",
        "--fault", "error_after=0.05", "--seed", str(random.randrange(1 << 30))])
    check(os.access(PYTHON, os.X_OK), "%s missing: run deploy/install-deps.sh" % PYTHON)
    svc = other = None
    try:
        orders_db_name = s.tag.lower() + "_orders"
        s.psql(s.admin_db, 'CREATE DATABASE "%s"' % orders_db_name)
        orders_db = s.db.rsplit("/", 1)[0] + "/" + orders_db_name
        # Late first looks (the worker writes them): UNKNOWN attempts stay
        # so for long enough to be polled.
        s.start_worker(WORKER_UNKNOWN_RETRIES=0, RECONCILER_FIRST_LOOK_MS=2000)
        s.start_reconciler(RECONCILER_SCHEDULE_MS=200, RECONCILER_POLL_MS=100)
        s.start_relay(RELAY_POLL_MS=100)
        _, api_port = charged_api.start_api(s)
        env = s.env({"ORDERS_DATABASE_URL": orders_db, "ORDERS_GROUP_ID": "orders-" + s.tag,
                     "ORDERS_INSTANCE_ID": "orders-1", "ORDERS_SESSION_TIMEOUT_MS": "6000",
                     "CHARGED_API_URL": "http://127.0.0.1:%d" % api_port})
        svc = Service(s, env)
        # A second instance joins the group for a while: two rebalances.
        other = Service(s, dict(env, ORDERS_INSTANCE_ID="orders-2"), "order_service_b")
        run(s, svc, other, env, orders_db)
    finally:
        e2e.stack_restore()
        for x in (svc, other):
            if x:
                x.close()


def run(s, svc, other, env, orders_db):
    def cli(*args):
        p = subprocess.run([PYTHON, SERVICE] + list(args), env=env, capture_output=True,
                           timeout=60)
        check_eq(p.returncode, 0, "order_service %s exit (%s)" % (args[0], p.stderr[-500:]))

    def q(sql):
        return [l.split("|") for l in s.psql(orders_db, sql).split()]

    def watch():
        svc.watch()
        other.watch()

    def processed():
        watch()
        return int(q("SELECT count(*) FROM processed_events")[0][0])

    cli("init")
    cli("place-orders", "--count", str(WAVES[0]))
    svc.start()

    # SIGKILL while it applies (once it has moved on), each time after a
    # new wave of orders, so that there is always more to apply.
    kills = 0
    for k in range(3):
        if k:
            cli("place-orders", "--count", str(WAVES[k]))
        # Past what it has applied, but never past what will come: each
        # attempt placed so far has at least its final event.
        floor = min(processed() + random.randint(5, 20),
                    int(q("SELECT count(*) FROM order_attempts")[0][0]))
        e2e.wait_until("the service applying past %d events" % floor,
                       lambda: processed() >= floor, 60, 0.05)
        svc.kill()
        kills += 1
        e2e.log("SIGKILLed the order service at %d events" % processed())
        if k == 0:
            other.start()
            e2e.wait_until("the second instance given partitions", lambda: b"partitions assigned"
                           in open(other.log_path(), "rb").read(), 60, 0.2)

    # The broker away while orders are placed: the outbox keeps them; the
    # service waits the outage out. The outage is the fault, not a wait.
    e2e.kafka_kill()
    cli("place-orders", "--count", str(WAVES[3]))
    time.sleep(3)
    watch()
    e2e.kafka_start()
    e2e.wait_until("every command of the service sent", lambda: watch() or q(
        "SELECT count(*) FROM outbox WHERE sent_at IS NULL") == [["0"]], 60, 0.2)

    # The second instance leaves: its partitions go back to the first.
    other.terminate()

    # PostgreSQL crashes and comes back: the service reconnects by itself.
    e2e.pg_stop_immediate()
    time.sleep(2)
    svc.watch()
    e2e.pg_start()
    before = processed()
    e2e.wait_until("the service applying again after PostgreSQL's restart",
                   lambda: processed() > before or settled(s, q), 60, 0.2)

    # A crash between send and mark, for every command: all sent again.
    resent = set(a for a, in q("SELECT command_id FROM outbox WHERE sent_at IS NOT NULL"))
    cli("resend")
    e2e.wait_until("every command sent again", lambda: watch() or q(
        "SELECT count(*) FROM outbox WHERE sent_at IS NULL") == [["0"]], 60, 0.2)

    e2e.wait_until("charged and the service settled", lambda: watch() or settled(s, q),
                   90, 0.3)
    # A relay's duplicates: some events again, succeeded ones among them.
    msgs = dump(s, "results")
    by_type = {}
    for m in msgs:
        by_type.setdefault(json.loads(m["value"])["type"], []).append(m)
    again = (random.sample(by_type["charge.succeeded"], 10) +
             random.sample(by_type.get("refund.succeeded", []),
                           min(5, len(by_type.get("refund.succeeded", [])))) +
             random.sample(msgs, 10))
    s.tool("produce", s.topics["results"], stdin="".join(json.dumps(
        {"key": m["key"], "value": m["value"], "headers": m["headers"]}) + "\n"
        for m in again).encode())
    e2e.wait_until("the service at the end of the results topic",
                   lambda: watch() or settled(s, q), 60, 0.3)

    svc.terminate()
    check_all(s, q, kills, resent)
    check_eq(svc.own_exits + other.own_exits, [], "exits of the order service nobody caused")


def dump(s, topic):
    return [json.loads(l) for l in s.tool("dump", s.topics[topic]).splitlines() if l.strip()]


def settled(s, q):
    """Nothing open in charged, everything sent both ways, the service's
    positions at the end of the results topic and its outbox empty."""
    try:
        attempts = s.query("SELECT (SELECT count(*) FROM payment_attempts WHERE status NOT IN "
                           "('SUCCEEDED','FAILED','REJECTED','REQUIRES_REVIEW')) + (SELECT "
                           "count(*) FROM refund_attempts WHERE status NOT IN ('SUCCEEDED',"
                           "'FAILED','REJECTED','REQUIRES_REVIEW')), (SELECT count(*) FROM "
                           "outbox WHERE published_at IS NULL)")[0]
        if attempts != ["0", "0"] or s.lag()["lag"] != 0:
            return False
        if q("SELECT count(*) FROM outbox WHERE sent_at IS NULL") != [["0"]]:
            return False
        if q("SELECT (SELECT count(*) FROM order_attempts WHERE confirm_due) + (SELECT "
             "count(*) FROM order_refunds WHERE confirm_due)") != [["0"]]:
            return False
        ends = {}
        for m in dump(s, "results"):
            ends[m["partition"]] = max(ends.get(m["partition"], 0), m["offset"] + 1)
        pos = dict((int(a), int(b)) for a, b in q(
            "SELECT kafka_partition, next_offset FROM consumer_positions"))
        return all(pos.get(p, 0) >= e for p, e in ends.items())
    except e2e.Failure:  # PostgreSQL still starting
        return False


def check_all(s, q, kills, resent):
    s.check_invariants()
    s.check_refund_invariants()
    msgs = dump(s, "results")
    events = dict((json.loads(m["value"])["event_id"], json.loads(m["value"])) for m in msgs)
    check(len(msgs) > len(events), "no duplicate on the topic: the dedupe was not exercised")

    # 1. Each event once.
    counts = dict((a, int(b)) for a, b in q("SELECT event_id, count(*) FROM processed_events "
                                            "GROUP BY 1"))
    check_eq(sorted(counts), sorted(events), "event_ids in processed_events against the topic")
    check(all(n == 1 for n in counts.values()), "an event processed twice")

    # 2. Every order paid at most once, at the provider (psp-sim's ledger).
    svc_attempts = dict((a, (o, int(n), k, pm, st or "")) for a, o, n, k, pm, st in q(
        "SELECT payment_attempt_id, order_id, attempt_no, idempotency_key, payment_method, "
        "coalesce(confirmed_status, '') FROM order_attempts"))
    charged = dict((a["id"], a) for a in s.attempts())
    paid_at_psp = {}
    for c in s.ledger():
        if c["outcome"] == "succeeded" and c["payment_attempt_id"] in svc_attempts:
            order = svc_attempts[c["payment_attempt_id"]][0]
            paid_at_psp.setdefault(order, []).append(c["payment_intent_id"])
    twice = [o for o, v in paid_at_psp.items() if len(v) > 1]
    check_eq(twice, [], "orders charged twice at psp-sim")

    # 3. One attempt in charged per attempt of the service, though every
    #    command was sent at least twice (resend); keys as the service chose.
    commands = [json.loads(m["value"]) for m in dump(s, "commands")]
    sends = {}
    for c in commands:
        if c["type"] == "charge.requested" and c["payment_attempt_id"] in svc_attempts:
            sends[c["payment_attempt_id"]] = sends.get(c["payment_attempt_id"], 0) + 1
    once = [a for a in svc_attempts if a in resent and sends.get(a, 0) < 2]
    check_eq(once, [], "commands of the resend sent only once")
    check_eq(sorted(sends), sorted(svc_attempts), "attempts whose command is on the topic")
    check_eq(sorted(a for a in charged if a in svc_attempts), sorted(svc_attempts),
             "charged's attempts against the service's")
    for a, (o, n, k, pm, _) in svc_attempts.items():
        check_eq((charged[a]["order_id"], charged[a]["key"]), (o, k), "attempt %s" % a)

    # 4. Second attempts: one for each order whose first attempt FAILED.
    by_order = {}
    for a, (o, n, k, pm, _) in svc_attempts.items():
        by_order.setdefault(o, {})[n] = a
    n_orders = int(q("SELECT count(*) FROM orders")[0][0])
    check_eq(len(by_order), n_orders, "orders with attempts")
    check_eq(n_orders, sum(WAVES), "orders of the service")
    seconds = 0
    for o, tries in by_order.items():
        first = charged[tries[1]]["status"]
        check_eq(sorted(tries), [1, 2] if first == "FAILED" else [1],
                 "attempts of order %s (first %s)" % (o, first))
        if 2 in tries:
            seconds += 1
            check(tries[2] != tries[1] and svc_attempts[tries[2]][2] != svc_attempts[tries[1]][2],
                  "the second attempt of %s has a new id and key" % o)
    check(seconds >= 3, "only %d second attempts after a decline" % seconds)

    # 5. Paid marks: each by its SUCCEEDED attempt, of which a charge.succeeded
    #    event asked (charged's api answered).
    succeeded = dict((a["order_id"], a["id"]) for a in charged.values()
                     if a["status"] == "SUCCEEDED" and a["id"] in svc_attempts)
    succ_events = set(ev["payment_attempt_id"] for ev in events.values()
                      if ev["type"] == "charge.succeeded")
    paid = dict(q("SELECT order_id, paid_attempt_id FROM orders WHERE paid"))
    check_eq(sorted(paid), sorted(succeeded), "orders paid against SUCCEEDED orders")
    for o, a in paid.items():
        check_eq(a, succeeded[o], "the attempt that paid order %s" % o)
        check(a in succ_events, "order %s paid, no charge.succeeded of %s" % (o, a))
    for o, v in paid_at_psp.items():
        check(o in paid, "order %s charged at psp-sim but not paid in the service" % o)

    # 6. Status polls: what charged's api said (never a reason for a new charge).
    polled = [(a, st) for a, (_, _, _, _, st) in svc_attempts.items() if st]
    for a, st in polled:
        check(st == charged[a]["status"] or st not in TERMINAL,
              "attempt %s polled %s, charged has %s" % (a, st, charged[a]["status"]))
    check(polled, "no attempt was polled")

    refunds = check_refunds(s, q, events)
    e2e.log("order service: %d messages, %d distinct events, each applied once; %d of %d orders "
            "paid, each once; %d second attempts; %d polls answered; %d refunds; %d SIGKILLs, two "
            "rebalances, a broker kill, a PostgreSQL restart" % (len(msgs), len(events), len(paid), n_orders,
                                                  seconds, len(polled), refunds, kills))


def check_refunds(s, q, events):
    """The service's refunds against charged's and the events on the topic."""
    rows = q("SELECT o.order_id, o.seq, o.amount, o.paid, coalesce(o.paid_attempt_id::text, "
             "''), o.refunded_amount, coalesce(r.refund_id::text, ''), "
             "coalesce(r.payment_attempt_id::text, ''), coalesce(r.amount, 0), "
             "coalesce(r.last_event_type, ''), coalesce(r.counted, false) "
             "FROM orders o LEFT JOIN order_refunds r USING (order_id)")
    charged = dict((r["id"], r) for r in s.refunds())
    ours = set()
    full = partial = 0
    for (order, seq, amount, paid, attempt, refunded, refund, r_attempt, r_amount, last,
         counted) in rows:
        want = refund_for(int(seq), int(amount)) if paid == "t" else None
        check(bool(refund) == bool(want), "order %s (seq %s, paid %s) has refund %r" % (
            order, seq, paid, refund))
        if not refund:
            check_eq(int(refunded), 0, "refunded total of unrefunded order %s" % order)
            continue
        ours.add(refund)
        full, partial = full + (want[0] == int(amount)), partial + (want[0] != int(amount))
        check_eq((int(r_amount), r_attempt), (want[0], attempt), "refund %s" % refund)
        c = charged.get(refund)
        check(c is not None, "refund %s unknown to charged" % refund)
        check_eq((c["attempt"], int(c["amount"])), (attempt, int(r_amount)),
                 "charged's refund %s" % refund)
        check_eq(last, "refund." + c["status"].lower(), "last refund event of %s" % refund)
        check_eq(int(refunded), int(r_amount) if c["status"] == "SUCCEEDED" else 0,
                 "refunded total of order %s" % order)
        check_eq(counted, "t" if c["status"] == "SUCCEEDED" else "f",
                 "refund %s counted (charged: %s)" % (refund, c["status"]))
    check_eq(sorted(charged), sorted(ours),
             "charged's refunds against the service's")
    check(full and partial, "full refunds %d, partial %d" % (full, partial))
    return len(ours)


if __name__ == "__main__":
    raise SystemExit(e2e.main(scenario))
