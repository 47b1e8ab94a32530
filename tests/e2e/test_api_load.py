"""charged api under a steady stream of webhooks with duplicates: for
LOAD_SECONDS, senders deliver LOAD_RATE signed success events per second,
one in five a redelivery of an event already sent (some while the first
delivery is still in flight). Nothing is lost (every event's attempt is
SUCCEEDED, its event recorded once) and nothing is applied twice (one
transition, one outbox event, one ledger row per attempt). The sustained
rate is reported; it decides nothing (timings live in bench/)."""

import json
import os
import random
import threading
import time

import charged_api as api
import charged_e2e as e2e
from charged_e2e import check, check_eq

RATE = int(os.environ.get("LOAD_RATE", "150"))
SECONDS = float(os.environ.get("LOAD_SECONDS", "10"))
SENDERS = 8
DUP_SHARE = 0.2


def scenario(make):
    s = make("api_load", partitions=1)
    name, port = api.start_api(s, API_THREADS=4)
    n_unique = int(RATE * SECONDS * (1 - DUP_SHARE)) + 1
    s.psql(s.db, "INSERT INTO payment_attempts (id, order_id, idempotency_key, "
           "request_fingerprint, amount, currency, payment_method, status, "
           "provider_payment_id, first_sent_at) SELECT gen_random_uuid(), gen_random_uuid(), "
           "'load-' || n, 'fp', 1000 + n, 'EUR', 'pm_card_visa', 'UNKNOWN', 'pi_load_' || n, now() "
           "FROM generate_series(1, %d) AS n" % n_unique)
    rows = s.query("SELECT id, order_id, amount, provider_payment_id FROM payment_attempts")
    attempts = [{"id": r[0], "order_id": r[1], "amount": int(r[2]), "currency": "EUR",
                 "ppid": r[3]} for r in rows]
    rnd = random.Random(int(os.environ.get("LOAD_SEED", "12")))
    # The schedule: every unique event once, and DUP_SHARE of the total as
    # redeliveries of an event scheduled earlier (often just before).
    schedule, sent_ids = [], []
    for a in attempts:
        schedule.append(json.dumps(api.event("succeeded", a)).encode())
        sent_ids.append(len(schedule) - 1)
        while rnd.random() < DUP_SHARE / (1 - DUP_SHARE) * 0.999:
            back = rnd.choice(sent_ids[-20:])
            schedule.append(schedule[back])
            if rnd.random() < 0.5:
                break
    e2e.log("schedule: %d deliveries, %d unique, %d redeliveries, target %d/s"
            % (len(schedule), n_unique, len(schedule) - n_unique, RATE))

    results, lock = [], threading.Lock()
    t0 = time.monotonic()
    cursor = [0]

    def sender():
        import http.client
        conn = None
        while True:
            with lock:
                i = cursor[0]
                cursor[0] += 1
            if i >= len(schedule):
                break
            due = t0 + i / RATE
            now = time.monotonic()
            if due > now:
                time.sleep(due - now)  # pacing the load, not waiting for a result
            body = schedule[i]
            headers = {"Content-Type": "application/json", "Stripe-Signature": api.sign(body)}
            for attempt in range(3):
                try:
                    if conn is None:
                        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=e2e.scaled(30))
                    conn.request("POST", "/v1/webhooks/provider", body, headers)
                    r = conn.getresponse()
                    doc = json.loads(r.read() or b"null")
                    with lock:
                        results.append((r.status, doc and doc.get("result")))
                    break
                except (OSError, http.client.HTTPException):
                    conn = None  # the server closed an idle keep-alive: reconnect
            else:
                with lock:
                    results.append((0, "connection failed"))
    threads = [threading.Thread(target=sender) for _ in range(SENDERS)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    elapsed = time.monotonic() - t0
    by = {}
    for st, res in results:
        by[(st, res)] = by.get((st, res), 0) + 1
    e2e.log("sustained %.1f deliveries/s (target %d/s) over %.1fs; answers %s"
            % (len(results) / elapsed, RATE, elapsed, by))
    print("RESULT api_webhooks_per_second=%.1f target=%d deliveries=%d"
          % (len(results) / elapsed, RATE, len(results)))
    check_eq(len(results), len(schedule), "answers")
    bad = {k: v for k, v in by.items() if k[0] != 200}
    check_eq(bad, {}, "answers other than 200")
    check_eq(by.get((200, "applied"), 0), n_unique, "deliveries applied")
    check_eq(by.get((200, "duplicate"), 0), len(schedule) - n_unique, "deliveries found duplicate")

    stats = s.query(
        "SELECT (SELECT count(*) FROM payment_attempts WHERE status = 'SUCCEEDED'),"
        " (SELECT count(*) FROM attempt_transitions),"
        " (SELECT count(DISTINCT payment_attempt_id) FROM attempt_transitions),"
        " (SELECT count(*) FROM outbox), (SELECT count(*) FROM ledger_entries),"
        " (SELECT count(*) FROM processed_webhook_events WHERE outcome = 'applied')")[0]
    check_eq([int(x) for x in stats], [n_unique] * 6,
             "SUCCEEDED, transitions, attempts with one, outbox, ledger, applied events")
    check_eq(api.stop_api(s, name), 0, "api exit status on SIGTERM")


if __name__ == "__main__":
    raise SystemExit(e2e.main(scenario))
