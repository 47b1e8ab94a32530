#!/usr/bin/env python3
"""/healthz, /readyz and the role's gauges on ADMIN_ADDR, for the worker, the
reconciler and the relay, against the real stack.

- worker: ready once it has a partition and its database answers; a second
  worker of a one-partition topic is live but not ready ("no partitions
  assigned") until the first one leaves; a worker whose DATABASE_URL points
  nowhere is live but not ready ("database unreachable"); after SIGTERM,
  while a provider call is still in flight, it is live ("ok: draining") and
  not ready ("not ready: draining"), and it still exits 0;
- reconciler: ready with its database, not ready without; its backlog gauge
  counts the UNKNOWN attempt the database holds, and its settlement counter
  the attempt it then settles;
- relay: ready with its database, not ready without; what it says it
  published is what the outbox marks published;
- api: ready with its database, not ready without; each webhook delivery is
  counted by its result.

The broken roles point at a closed port; the shared stack is never touched.
"""
import os
import signal
import subprocess
import sys

import charged_api as api
import charged_e2e as e2e
from charged_e2e import check, check_eq

NOWHERE = "postgresql://charged@127.0.0.1:1/charged"


def probes(s, name):
    return s.admin_get(name, "/healthz"), s.admin_get(name, "/readyz")


def wait_probes(s, name, health, ready, timeout=60):
    """Until /healthz and /readyz of name answer exactly (status, body)."""
    want = ((health[0], health[1] + "\n"), (ready[0], ready[1] + "\n"))
    last = [None]

    def match():
        last[0] = probes(s, name)
        return last[0] == want
    try:
        e2e.wait_until("%s to answer %s" % (name, want), match, timeout)
    except e2e.Failure:
        raise e2e.Failure("%s answers %r, want %r" % (name, last[0], want))


def log_has(s, name, text):
    with open("%s/%s.log" % (s.dir, name), encoding="utf-8", errors="replace") as f:
        return text in f.read()


def gauge(s, name, series):
    return s.admin_metrics(name).get(series)


def workers(s):
    w1 = s.start_worker()
    wait_probes(s, w1, (200, "ok"), (200, "ready"))
    check_eq(gauge(s, w1, "charged_ready"), 1.0, "charged_ready of the ready worker")

    # One partition, two workers: the second one has nothing to do.
    w2 = s.start_worker()
    e2e.wait_until("w2's first assignment", lambda: log_has(
        s, w2, '"msg":"partitions assigned","count":"0"'), 60)
    wait_probes(s, w2, (200, "ok"), (503, "not ready: no partitions assigned"))
    check_eq(gauge(s, w2, "charged_ready"), 0.0, "charged_ready of the idle worker")

    # Its own group (so it gets the partition), a database that is not there.
    w3 = s.start_worker(DATABASE_URL=NOWHERE, KAFKA_GROUP_ID=s.group + "-nodb")
    wait_probes(s, w3, (200, "ok"), (503, "not ready: database unreachable"))
    m = s.admin_metrics(w3)
    check(m.get('charged_database_failures_total{stage="ping"}', 0) >= 1,
          "w3's failed pings are not counted: %s" % m)
    s.kill_worker(w3, signal.SIGTERM)
    return w1, w2


def reconcilers(s, w1):
    # An attempt left UNKNOWN: its first answer is a 500 after executing, and
    # the workers do not ask again (WORKER_UNKNOWN_RETRIES=0).
    cmd = e2e.new_command(amount=4242)
    s.psp_put("/faults", {"rules": [{"kind": "error_after", "key": cmd["idempotency_key"],
                                     "probability": 1, "times": 1}]})
    s.publish([cmd])
    e2e.wait_until("the attempt UNKNOWN", lambda: s.query(
        "SELECT status FROM payment_attempts WHERE id = '%s'" % cmd["payment_attempt_id"])
        == [["UNKNOWN"]], 60)
    s.psp_put("/faults", {}, method="DELETE")

    r1 = s.start_reconciler()
    wait_probes(s, r1, (200, "ok"), (200, "ready"))
    unknown = 'charged_reconciler_backlog_attempts{status="UNKNOWN"}'
    db_unknown = int(s.query("SELECT count(*) FROM payment_attempts WHERE status = 'UNKNOWN'")[0][0])
    check_eq(db_unknown, 1, "UNKNOWN attempts in the database")
    e2e.wait_until("the backlog gauge to count the UNKNOWN attempt",
                   lambda: gauge(s, r1, unknown) == db_unknown, 30)
    age = gauge(s, r1, 'charged_reconciler_oldest_attempt_age_seconds{status="UNKNOWN"}')
    check(age is not None and age > 0, "age of the oldest UNKNOWN attempt: %r" % age)

    # First look after RECONCILER_FIRST_LOOK_MS (the worker wrote it): inside
    # the key's window the reconciler charges again under the attempt's key,
    # and the provider's replay of the executed intent settles it.
    e2e.wait_until("the reconciler to settle it", lambda: s.query(
        "SELECT status FROM payment_attempts WHERE id = '%s'" % cmd["payment_attempt_id"])
        == [["SUCCEEDED"]], 90)
    e2e.wait_until("the settlement counted and the backlog gauge at 0", lambda: (
        gauge(s, r1, 'charged_reconciler_settlements_total{status="SUCCEEDED"}') == 1
        and gauge(s, r1, unknown) == 0), 30)
    m = s.admin_metrics(r1)
    check(m.get('charged_provider_responses_total{operation="charge",class="succeeded"}', 0) >= 1,
          "the reconciler's charge again (the replay) is not counted: %s" % m)

    r2 = s.start_reconciler(DATABASE_URL=NOWHERE)
    wait_probes(s, r2, (200, "ok"), (503, "not ready: database unreachable"))
    check_eq(gauge(s, r2, "charged_ready"), 0.0, "charged_ready without a database")
    s.stop_reconciler(r2)
    check_eq(s.stop_reconciler(r1), 0, "exit status of the reconciler")


def relays(s):
    rl1 = s.start_relay(RELAY_POLL_MS=100, RELAY_BACKLOG_LOG_MS=200)
    wait_probes(s, rl1, (200, "ok"), (200, "ready"))
    events = int(s.query("SELECT count(*) FROM outbox")[0][0])
    check(events > 0, "no result events in the outbox")

    def published():
        left = int(s.query("SELECT count(*) FROM outbox WHERE published_at IS NULL")[0][0])
        m = s.admin_metrics(rl1)
        return (left == 0 and m.get("charged_outbox_published_total") == events
                and m.get("charged_outbox_backlog_events") == 0)
    e2e.wait_until("every event published, counted, and the backlog gauge at 0", published, 60)

    rl2 = s.start_relay(DATABASE_URL=NOWHERE)
    wait_probes(s, rl2, (200, "ok"), (503, "not ready: database unreachable"))
    s.stop_relay(rl2)
    check_eq(s.stop_relay(rl1), 0, "exit status of the relay")


def apis(s):
    a1, port = api.start_api(s)
    wait_probes(s, a1, (200, "ok"), (200, "ready"))
    attempt = api.insert_attempt(s, "UNKNOWN", ppid="pi_admin_health_0001")
    body = api.event("succeeded", attempt)
    check_eq(api.post_webhook(port, body, secret="whsec_not_the_one")[0], 400, "forged webhook")
    check_eq(api.post_webhook(port, body)[0], 200, "signed webhook")
    check_eq(api.post_webhook(port, body)[0], 200, "the same webhook again")
    m = s.admin_metrics(a1)
    got = dict((k, v) for k, v in m.items() if k.startswith("charged_webhook_deliveries_total"))
    check_eq(got, {'charged_webhook_deliveries_total{result="bad_signature"}': 1.0,
                   'charged_webhook_deliveries_total{result="applied"}': 1.0,
                   'charged_webhook_deliveries_total{result="duplicate"}': 1.0},
             "webhook deliveries counted by the api")
    # Without a database: started by hand, as start_api waits for answers
    # that need one.
    a2 = "api-nodb"
    env = s.env({"API_ADDR": "127.0.0.1:%d" % e2e.free_port(), "DATABASE_URL": NOWHERE,
                 "WEBHOOK_SIGNING_SECRET": api.SECRET})
    out = open(os.path.join(s.dir, a2 + ".log"), "ab")
    s.apis[a2] = subprocess.Popen([e2e.CHARGED, "api"], stdout=out, stderr=out, env=env)
    wait_probes(s, a2, (200, "ok"), (503, "not ready: database unreachable"))
    check_eq(api.stop_api(s, a2), 0, "exit status of the api without a database")
    check_eq(api.stop_api(s, a1), 0, "exit status of the api")


def handover_and_drain(s, w1, w2):
    # The idle worker becomes ready when the partition comes to it.
    check_eq(s.kill_worker(w1, signal.SIGTERM), 0, "exit status of w1")
    wait_probes(s, w2, (200, "ok"), (200, "ready"))
    m = s.admin_metrics(w2)
    check(m.get('charged_rebalances_total{kind="assign"}', 0) >= 2,
          "w2 counted fewer than two assignments: %s" % m)

    # A call in flight (its answer held by the provider) when SIGTERM comes:
    # the drain waits for it, live and not ready.
    cmd = e2e.new_command(amount=777)
    s.psp_put("/faults", {"rules": [{"kind": "stall_after", "key": cmd["idempotency_key"],
                                     "probability": 1, "times": 1}]})
    s.publish([cmd])
    e2e.wait_until("the charge executed and its answer held", lambda: any(
        c["idempotency_key"] == cmd["idempotency_key"] for c in s.ledger()), 60, 0.05)
    s.workers[w2].send_signal(signal.SIGTERM)
    # The held call times out after PROVIDER_TIMEOUT_MS (2 s): that long at
    # least, the worker drains.
    seen = set()
    while s.workers[w2].poll() is None and len(seen) < 2:
        try:
            h, r = probes(s, w2)
        except OSError:
            break  # the listener went with the process
        check(h[0] == 200, "w2 not live while stopping: %r" % (h,))
        if h == (200, "ok: draining\n"):
            seen.add("live")
        if r == (503, "not ready: draining\n"):
            seen.add("not ready")
    check_eq(sorted(seen), ["live", "not ready"], "what w2 answered while draining")
    check_eq(s.wait_worker_exit(w2, 60), 0, "exit status of w2 after its drain")
    # Finished, not given up: the timed-out call's outcome is stored.
    check_eq(s.query("SELECT status FROM payment_attempts WHERE id = '%s'"
                     % cmd["payment_attempt_id"]), [["UNKNOWN"]], "the drained attempt")


def scenario(new):
    # RECONCILER_FIRST_LOOK_MS: the UNKNOWN attempt waits long enough for the
    # backlog gauge (counted every 5 s) to show it. No retries of an unknown
    # outcome: one 500 after executing leaves an attempt UNKNOWN.
    s = new("admin_health", partitions=1,
            worker_env={"RECONCILER_FIRST_LOOK_MS": "12000", "RECONCILER_POLL_MS": "200",
                        "WORKER_UNKNOWN_RETRIES": "0"})
    w1, w2 = workers(s)
    reconcilers(s, w1)
    relays(s)
    handover_and_drain(s, w1, w2)
    s.check_invariants()
    # Last: its webhook settles an attempt written straight into the
    # database, which the provider's ledger does not know.
    apis(s)


if __name__ == "__main__":
    sys.exit(e2e.main(scenario))
