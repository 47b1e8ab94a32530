"""What the order service's e2e tests share: its environment, with charged's
api, and its database's rows against charged's and psp-sim's
(tests/e2e/test_adv41*.py)."""
import time

import charged_api
import charged_e2e as e2e


def service_env(s, orders_db, api_port=None, **more):
    """The order service's environment for scenario s, with charged's api
    started for it (what pays an order is the api's answer), on api_port
    when given (the port psp-sim sends its webhooks to)."""
    _, port = charged_api.start_api(s, port=api_port)
    env = {"ORDERS_DATABASE_URL": orders_db, "ORDERS_GROUP_ID": "orders-" + s.tag,
           "ORDERS_SESSION_TIMEOUT_MS": "6000", "CHARGED_API_URL": "http://127.0.0.1:%d" % port}
    env.update(more)
    return s.env(env)


def rows(s, orders_db, sql):
    return [l.split("|") for l in s.psql(orders_db, sql).split()]


def paid_vs_psp(s, orders_db):
    """(orders psp-sim charged, orders the service marks paid), as sets."""
    ours = dict(rows(s, orders_db, "SELECT payment_attempt_id, order_id FROM order_attempts"))
    at_psp = set(ours[c["payment_attempt_id"]] for c in s.ledger()
                 if c["outcome"] == "succeeded" and c["payment_attempt_id"] in ours)
    paid = set(o for o, in rows(s, orders_db, "SELECT order_id FROM orders WHERE paid"))
    return at_psp, paid


def charged_settled(s, orders_db):
    """Every attempt of charged's settled, every result published, every
    command of the service sent."""
    r = s.query("SELECT (SELECT count(*) FROM payment_attempts WHERE status NOT IN "
                "('SUCCEEDED','FAILED','REJECTED','REQUIRES_REVIEW')), (SELECT "
                "count(*) FROM outbox WHERE published_at IS NULL)")[0]
    return r == ["0", "0"] and rows(
        s, orders_db, "SELECT count(*) FROM outbox WHERE sent_at IS NULL") == [["0"]]


def wait_paid_as_charged(s, orders_db, seconds=60):
    """Waits, at most `seconds` (scaled), until both sides settled and every
    attempt the service made has its outcome confirmed (a second attempt after
    a decline is made, sent and charged after the first's event, so nothing
    more can be charged while we compare); returns paid_vs_psp then."""
    deadline = time.time() + e2e.scaled(seconds)
    while time.time() < deadline:
        at_psp, paid = paid_vs_psp(s, orders_db)
        if at_psp == paid and charged_settled(s, orders_db) and rows(
                s, orders_db, "SELECT count(*) FROM order_attempts WHERE last_event_type IS "
                "NULL OR last_event_type = 'charge.unknown' OR confirm_due") == [["0"]]:
            return at_psp, paid
        time.sleep(0.5)
    return paid_vs_psp(s, orders_db)


def drop_database(psycopg, base_url, name):
    """Drops a test's own database: our role's sessions on it ended first
    (a thread's connection left open), then DROP DATABASE, which ends the
    autovacuum workers there itself (WITH (FORCE) would also try to end
    other roles' sessions, and is refused for them)."""
    with psycopg.connect(base_url, autocommit=True) as admin:
        admin.execute("SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE "
                      "datname = %s AND usename = current_user AND pid <> pg_backend_pid()",
                      (name,))
        admin.execute('DROP DATABASE IF EXISTS "%s"' % name)
