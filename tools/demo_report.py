#!/usr/bin/env python3
"""The demo's burst and report: publishes N charge commands (10% of them
twice, a few bad ones), waits until every attempt is settled, then reports
attempts by status, what the provider charged, double charges, dead letters
and the elapsed time. Python standard library, psql and kcat."""
import argparse
import json
import os
import random
import subprocess
import sys
import time
import urllib.request
import uuid


def psql(sql, url=None):
    out = subprocess.run(["psql", "-X", "-q", "-tA", url or os.environ["DATABASE_URL"], "-c",
                          sql], check=True, capture_output=True).stdout.decode()
    return [l.split("|") for l in out.strip().splitlines() if l]


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
    applied (once each), and its paid marks next to charged's statuses."""
    attempts = [r[0] for r in psql("SELECT payment_attempt_id FROM order_attempts", orders_db)]
    if not attempts:
        print("order service:        no orders placed")
        return
    ids = "','".join(attempts)
    want = int(psql("SELECT count(*) FROM outbox WHERE payment_attempt_id IN ('%s')" % ids)[0][0])
    while int(psql("SELECT count(*) FROM processed_events WHERE payment_attempt_id IN ('%s')"
                   % ids, orders_db)[0][0]) < want:
        if time.monotonic() > deadline:
            print("demo: the order service did not receive every event", file=sys.stderr)
            break
        time.sleep(0.5)
    charged = dict(psql("SELECT status, count(*) FROM payment_attempts WHERE id IN ('%s') "
                        "GROUP BY 1" % ids))
    got = psql("SELECT count(*), count(DISTINCT event_id) FROM processed_events WHERE "
               "payment_attempt_id IN ('%s')" % ids, orders_db)[0]
    paid = psql("SELECT count(*) FILTER (WHERE paid), count(*) FROM orders", orders_db)[0]
    print("order service:        %s orders, %s paid (charged: %s); %s result events applied, "
          "each once (%s distinct)" % (paid[1], paid[0], ", ".join(
              "%s %s" % kv for kv in sorted(charged.items())), got[0], got[1]))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--commands", type=int, default=1000)
    ap.add_argument("--psp-admin", required=True)
    ap.add_argument("--chargectl", required=True)
    ap.add_argument("--state", required=True)
    ap.add_argument("--orders-db", help="the example order service's database")
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
    events = psql("SELECT event_type, count(*) FROM outbox WHERE payment_attempt_id IN "
                  "('%s') GROUP BY 1 ORDER BY 2 DESC" % ids)
    ledger = json.load(urllib.request.urlopen(a.psp_admin + "/ledger"))["charges"]
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
    print("after the workers:    " + ", ".join("%s %s" % (s, n) for s, n in workers_done))
    print("settled by reconciler: " + (", ".join("%s %s" % (s, n) for s, n in by_reconciler)
                                      or "none"))
    print("attempts by status:   " + ", ".join("%s %s" % (s, n) for s, n in by_status))
    unknown = sum(int(n) for s, n in by_status if s in ("UNKNOWN", "PROCESSING"))
    print("unknown or processing: %d" % unknown)
    print("charges at provider:  %d executed, %d succeeded" % (len(ledger), len(succeeded)))
    print("double charges:       %d" % double)
    print("events published:     " + ", ".join("%s %s" % (t, n) for t, n in events))
    print("succeeded, unbooked:  %d (charged at the provider, not SUCCEEDED here)" %
          len(succeeded - recorded))
    print("dead letters:         %d (%s)" % (sum(reasons.values()),
                                              ", ".join("%s %d" % kv for kv in sorted(reasons.items()))))
    if a.orders_db:
        order_service_report(a.orders_db, deadline)
    print("elapsed:              %.1f s for %d messages, %.1f s until nothing was unknown" %
          (elapsed, len(burst) + len(bad), reconciled))
    return 0 if double == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
