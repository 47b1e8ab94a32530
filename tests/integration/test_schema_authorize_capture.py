#!/usr/bin/env python3
"""Migrations 0016-0018's rules (the authorize, capture and void folders' own), asked of the database itself (issue 37): a fresh
database migrated by chargectl, rows written by hand the way the stores
will write them, and each rule broken on purpose.

- Only a manual attempt is AUTHORIZED or VOIDED; AUTHORIZED names its
  intent; an AUTHORIZED attempt is its order's live one.
- The hold: of a capture and a void claiming one authorization, one wins
  (the claim's UPDATE ... WHERE held_by IS NULL), in sequence and in a real
  race of two connections (the second blocks on the row, then finds the
  hold taken); a step cannot hold an authorization that does not name it,
  nor call (PROCESSING) without it; a hold is taken only from AUTHORIZED,
  never passed from one step to another, kept through REQUIRES_REVIEW and
  UNKNOWN, spent at SUCCEEDED, VOIDED, FAILED; a step is recorded PENDING
  or REJECTED and unheld, and names its authorization for good; a capture
  holds only for an amount within the authorization's.
- A step that FAILS gives the hold back; a capture succeeds only while its
  authorization is SUCCEEDED with the same captured_amount, a void only
  while it is VOIDED; a captured authorization is never VOIDED; a capture
  and a void never both succeed; a SUCCEEDED step stays so; at most one
  capture and one void succeed per authorization.
- captured <= authorized; SUCCEEDED of a manual attempt names what it
  captured; refunds are bound by what was captured (nothing before).
- One namespace of keys: a capture cannot take a charge's key.

Runs with deploy/.tools' python (psycopg); started by another python it
runs itself again with that one."""
import os
import subprocess
import sys
import threading
import time
import uuid

HERE = os.path.dirname(os.path.abspath(__file__))
SOURCE = os.environ.get("CHARGED_SOURCE_DIR") or os.path.join(HERE, "..", "..")
BUILD = os.environ.get("CHARGED_BUILD_DIR") or os.path.join(SOURCE, "build")
PYTHON = os.environ.get("ORDER_SERVICE_PYTHON",
                        os.path.join(SOURCE, "deploy", ".tools", "bin", "python"))
try:
    import psycopg
except ImportError:
    if not os.access(PYTHON, os.X_OK):
        print("%s missing: run deploy/install-deps.sh" % PYTHON, file=sys.stderr)
        sys.exit(1)
    os.execv(PYTHON, [PYTHON] + sys.argv)

FAILURES = []


def check_eq(got, want, what):
    if got != want:
        FAILURES.append("%s: got %r, want %r" % (what, got, want))
        print("FAIL", FAILURES[-1], file=sys.stderr)


def refused(conn, what, sql, *args):
    """The statement must fail with an integrity error (a CHECK, a unique
    index, a trigger's check_violation); nothing of it stays."""
    try:
        with conn.transaction():
            conn.execute(sql, args)
    except psycopg.errors.IntegrityError:
        return
    FAILURES.append("not refused: %s" % what)
    print("FAIL not refused:", what, file=sys.stderr)


def attempt(conn, status="AUTHORIZED", method="manual", amount=1000, order=None):
    a, order = str(uuid.uuid4()), order or str(uuid.uuid4())
    conn.execute(
        "INSERT INTO payment_attempts (id, order_id, idempotency_key, request_fingerprint, "
        "amount, currency, payment_method, status, provider_payment_id, capture_method) "
        "VALUES (%s, %s, %s, 'fp', %s, 'EUR', 'pm_card_visa', %s, %s, %s)",
        (a, order, "k-" + a, amount, status,
         None if status in ("PENDING", "PROCESSING") else "pi_" + a[:8], method))
    return a, order


def step(conn, table, a, **cols):
    s = str(uuid.uuid4())
    extra = {"capture_attempts": {}, "void_attempts": {"void_reason": "abandoned"}}[table]
    extra.update(cols)
    names = ["id", "payment_attempt_id", "idempotency_key", "request_fingerprint", "status"]
    values = [s, a, "k-" + s, "fp", "PENDING"]
    names += list(extra)
    values += list(extra.values())
    conn.execute("INSERT INTO %s (%s) VALUES (%s)" % (table, ", ".join(names), ", ".join(
        ["%s"] * len(values))), values)
    return s


def claim(conn, table, kind, a, s):
    """The claim as a store makes it: the hold, then the step. True when won."""
    with conn.transaction():
        held = conn.execute("UPDATE payment_attempts SET held_by = %s, held_by_id = %s "
                            "WHERE id = %s AND status = 'AUTHORIZED' AND held_by IS NULL "
                            "RETURNING 1", (kind, s, a)).fetchone()
        if held is None:
            conn.execute("UPDATE %s SET status = 'REJECTED', reason = 'held' WHERE id = %%s"
                         % table, (s,))
            return False
        conn.execute("UPDATE %s SET status = 'PROCESSING', holds = true WHERE id = %%s" % table,
                     (s,))
        return True


CLAIM_HOLD = ("UPDATE payment_attempts SET held_by = %s, held_by_id = %s "
              "WHERE id = %s AND status = 'AUTHORIZED' AND held_by IS NULL RETURNING 1")


def claim_refused(conn, what, table, kind, a, s):
    """The claim's transaction must fail with an integrity error."""
    try:
        claim(conn, table, kind, a, s)
    except psycopg.errors.IntegrityError:
        return
    FAILURES.append("not refused: %s" % what)
    print("FAIL not refused:", what, file=sys.stderr)


def held(conn, table, kind, amount=1000, **cols):
    """A fresh authorization, and a step of it that won the claim."""
    a, _ = attempt(conn, amount=amount)
    s = step(conn, table, a, **cols)
    check_eq(claim(conn, table, kind, a, s), True, "a %s claiming a fresh authorization" % kind)
    return a, s


def steps_succeed(conn):
    """Rule 1: a step succeeds only on what its authorization became."""
    q = lambda sql, *a: conn.execute(sql, a).fetchall()  # noqa: E731
    a, v = held(conn, "void_attempts", "void")
    conn.execute("UPDATE payment_attempts SET status = 'SUCCEEDED', captured_amount = 1000 "
                 "WHERE id = %s", (a,))
    refused(conn, "a void SUCCEEDED while its authorization is captured",
            "UPDATE void_attempts SET status = 'SUCCEEDED' WHERE id = %s", v)
    refused(conn, "a captured authorization VOIDED",
            "UPDATE payment_attempts SET status = 'VOIDED' WHERE id = %s", a)

    a, c = held(conn, "capture_attempts", "capture")
    conn.execute("UPDATE payment_attempts SET status = 'VOIDED' WHERE id = %s", (a,))
    refused(conn, "a capture SUCCEEDED while its authorization is VOIDED",
            "UPDATE capture_attempts SET status = 'SUCCEEDED', captured_amount = 1000 "
            "WHERE id = %s", c)

    a, c = held(conn, "capture_attempts", "capture")
    conn.execute("UPDATE payment_attempts SET status = 'SUCCEEDED', captured_amount = 700 "
                 "WHERE id = %s", (a,))
    refused(conn, "a capture SUCCEEDED with another amount than its authorization's",
            "UPDATE capture_attempts SET status = 'SUCCEEDED', captured_amount = 600 "
            "WHERE id = %s", c)
    conn.execute("UPDATE capture_attempts SET status = 'SUCCEEDED', captured_amount = 700 "
                 "WHERE id = %s", (c,))
    check_eq(q("SELECT status FROM capture_attempts WHERE id = %s", c), [("SUCCEEDED",)],
             "a capture SUCCEEDED with its authorization's amount")

    # Both steps hold (the capture's hold given back by hand, the void's
    # taken): the capture succeeds, then the authorization is VOIDED with
    # its captured_amount cleared; the void must still not succeed.
    a, c = held(conn, "capture_attempts", "capture")
    conn.execute("UPDATE payment_attempts SET held_by = NULL, held_by_id = NULL WHERE id = %s",
                 (a,))
    v = step(conn, "void_attempts", a)
    check_eq(claim(conn, "void_attempts", "void", a, v), True, "a void after a hold given back")
    with conn.transaction():
        conn.execute("UPDATE payment_attempts SET status = 'SUCCEEDED', captured_amount = 1000 "
                     "WHERE id = %s", (a,))
        conn.execute("UPDATE capture_attempts SET status = 'SUCCEEDED', captured_amount = 1000 "
                     "WHERE id = %s", (c,))
    conn.execute("UPDATE payment_attempts SET status = 'VOIDED', captured_amount = NULL "
                 "WHERE id = %s", (a,))
    refused(conn, "a void SUCCEEDED beside a SUCCEEDED capture",
            "UPDATE void_attempts SET status = 'SUCCEEDED' WHERE id = %s", v)


def hold_rules(conn):
    """Rules 2 and 3: the hold is the database's, not a convention."""
    q = lambda sql, *a: conn.execute(sql, a).fetchall()  # noqa: E731
    # (a) never passed from one step to another.
    a, c = held(conn, "capture_attempts", "capture")
    v = step(conn, "void_attempts", a)
    refused(conn, "a hold passed from a capture to a void",
            "UPDATE payment_attempts SET held_by = 'void', held_by_id = %s WHERE id = %s", v, a)
    c2 = step(conn, "capture_attempts", a)
    refused(conn, "a hold passed from one capture to another",
            "UPDATE payment_attempts SET held_by_id = %s WHERE id = %s", c2, a)

    # (b) recorded PENDING or REJECTED, unheld: nothing bypasses the claim.
    for status in ("PROCESSING", "UNKNOWN", "SUCCEEDED"):
        refused(conn, "a capture recorded %s, holding" % status,
                "INSERT INTO capture_attempts (id, payment_attempt_id, idempotency_key, "
                "request_fingerprint, status, holds, captured_amount) VALUES "
                "(gen_random_uuid(), %s, gen_random_uuid()::text, 'fp', %s, true, 1)",
                a, status)
    refused(conn, "a void recorded PENDING, holding",
            "INSERT INTO void_attempts (id, payment_attempt_id, idempotency_key, "
            "request_fingerprint, status, holds, void_reason) VALUES "
            "(gen_random_uuid(), %s, gen_random_uuid()::text, 'fp', 'PENDING', true, "
            "'abandoned')", a)

    # (c) a step names its authorization for good.
    b, _ = attempt(conn)
    refused(conn, "a holding capture moved to another authorization",
            "UPDATE capture_attempts SET payment_attempt_id = %s WHERE id = %s", b, c)

    # (d) kept while the outcome is in doubt, spent when settled; taken only
    # from AUTHORIZED.
    conn.execute("UPDATE payment_attempts SET status = 'REQUIRES_REVIEW' WHERE id = %s", (a,))
    conn.execute("UPDATE payment_attempts SET status = 'UNKNOWN' WHERE id = %s", (a,))
    check_eq(q("SELECT held_by, held_by_id FROM payment_attempts WHERE id = %s", a),
             [("capture", uuid.UUID(c))], "the hold through REQUIRES_REVIEW and UNKNOWN")
    check_eq(claim(conn, "void_attempts", "void", a, v), False, "a void while the hold is kept")
    conn.execute("UPDATE payment_attempts SET status = 'FAILED' WHERE id = %s", (a,))
    check_eq(q("SELECT held_by FROM payment_attempts WHERE id = %s", a), [(None,)],
             "the hold once the authorization FAILED")
    conn.execute("UPDATE payment_attempts SET status = 'REQUIRES_REVIEW' WHERE id = %s", (b,))
    cb = step(conn, "capture_attempts", b)
    refused(conn, "a hold taken from REQUIRES_REVIEW",
            "UPDATE payment_attempts SET held_by = 'capture', held_by_id = %s WHERE id = %s",
            cb, b)

    # 3: a capture holds only for an amount within the authorization's.
    d, _ = attempt(conn)
    cd = step(conn, "capture_attempts", d, amount=1001)
    claim_refused(conn, "a capture of 1001 claiming an authorization of 1000",
                  "capture_attempts", "capture", d, cd)
    check_eq(q("SELECT held_by FROM payment_attempts WHERE id = %s", d), [(None,)],
             "the authorization after a capture over it was refused")
    d, cd = held(conn, "capture_attempts", "capture")
    refused(conn, "a holding capture raised over its authorization",
            "UPDATE capture_attempts SET amount = 1001 WHERE id = %s", cd)


def race(conn, url):
    """Two connections claim one authorization at once: B's claim blocks on
    the row A's claim updated; A commits; B finds the hold taken and
    REJECTS its step."""
    q = lambda sql, *a: conn.execute(sql, a).fetchall()  # noqa: E731
    a, _ = attempt(conn)
    c = step(conn, "capture_attempts", a)
    v = step(conn, "void_attempts", a)
    with psycopg.connect(url, autocommit=True) as ca, \
            psycopg.connect(url, autocommit=True) as cb:
        ca.execute("BEGIN")
        cb.execute("BEGIN")
        won_a = ca.execute(CLAIM_HOLD, ("capture", c, a)).fetchone() is not None
        ca.execute("UPDATE capture_attempts SET status = 'PROCESSING', holds = true "
                   "WHERE id = %s", (c,))
        result = {}

        def claim_b():
            try:
                won = cb.execute(CLAIM_HOLD, ("void", v, a)).fetchone() is not None
                if won:
                    cb.execute("UPDATE void_attempts SET status = 'PROCESSING', holds = true "
                               "WHERE id = %s", (v,))
                else:
                    cb.execute("UPDATE void_attempts SET status = 'REJECTED', reason = 'held' "
                               "WHERE id = %s", (v,))
                cb.execute("COMMIT")
                result["won"] = won
            except Exception as e:  # reported below, not lost in the thread
                result["error"] = repr(e)

        t = threading.Thread(target=claim_b)
        t.start()
        # B must be waiting on A's row lock before A commits (a deadline,
        # not a sleep: the wait is proven by pg_blocking_pids).
        deadline, blocked = time.monotonic() + 10, False
        while not blocked and time.monotonic() < deadline and t.is_alive():
            blocked = q("SELECT %s = ANY (pg_blocking_pids(%s))", ca.info.backend_pid,
                        cb.info.backend_pid)[0][0]
        check_eq(blocked, True, "B's claim waiting on A's")
        ca.execute("COMMIT")
        t.join(10)
        check_eq(t.is_alive(), False, "B's claim done once A committed")
    check_eq((won_a, result.get("won"), result.get("error")), (True, False, None),
             "two claims at once: A won, B found the hold taken")
    check_eq(q("SELECT held_by, held_by_id FROM payment_attempts WHERE id = %s", a),
             [("capture", uuid.UUID(c))], "the hold after the race")
    check_eq(q("SELECT status, holds FROM void_attempts WHERE id = %s", v),
             [("REJECTED", False)], "the void that lost the race")


def scenario(conn, url):
    q = lambda sql, *a: conn.execute(sql, a).fetchall()  # noqa: E731

    # The attempt's own states.
    refused(conn, "an automatic attempt AUTHORIZED", "INSERT INTO payment_attempts (id, "
            "order_id, idempotency_key, request_fingerprint, amount, currency, payment_method, "
            "status, provider_payment_id) VALUES (gen_random_uuid(), gen_random_uuid(), "
            "'k-auto', 'fp', 1, 'EUR', 'pm', 'AUTHORIZED', 'pi_x')")
    refused(conn, "AUTHORIZED without its intent", "INSERT INTO payment_attempts (id, "
            "order_id, idempotency_key, request_fingerprint, amount, currency, payment_method, "
            "status, capture_method) VALUES (gen_random_uuid(), gen_random_uuid(), 'k-noid', "
            "'fp', 1, 'EUR', 'pm', 'AUTHORIZED', 'manual')")
    a, order = attempt(conn)
    refused(conn, "a second live attempt beside an AUTHORIZED one",
            "INSERT INTO payment_attempts (id, order_id, idempotency_key, request_fingerprint, "
            "amount, currency, payment_method, status) VALUES (gen_random_uuid(), %s, "
            "'k-second', 'fp', 1, 'EUR', 'pm', 'PENDING')", order)
    refused(conn, "SUCCEEDED manual attempt without captured_amount",
            "UPDATE payment_attempts SET status = 'SUCCEEDED' WHERE id = %s", a)
    refused(conn, "captured more than authorized", "UPDATE payment_attempts SET status = "
            "'SUCCEEDED', captured_amount = 1001 WHERE id = %s", a)
    refused(conn, "a refund reserved before any capture",
            "UPDATE payment_attempts SET refund_reserved = 1 WHERE id = %s", a)

    # A capture and a void racing for one authorization: one wins.
    c = step(conn, "capture_attempts", a, amount=600)
    v = step(conn, "void_attempts", a)
    check_eq((claim(conn, "capture_attempts", "capture", a, c),
              claim(conn, "void_attempts", "void", a, v)), (True, False),
             "capture claimed first, then the void")
    check_eq(q("SELECT status, holds FROM void_attempts WHERE id = %s", v),
             [("REJECTED", False)], "the void that lost")
    v2 = step(conn, "void_attempts", a)
    refused(conn, "a void calling without the hold",
            "UPDATE void_attempts SET status = 'PROCESSING' WHERE id = %s", v2)
    refused(conn, "a void taking a hold that names the capture",
            "UPDATE void_attempts SET status = 'PROCESSING', holds = true WHERE id = %s", v2)
    refused(conn, "a capture SUCCEEDED while its authorization is still AUTHORIZED",
            "UPDATE capture_attempts SET status = 'SUCCEEDED', captured_amount = 600 "
            "WHERE id = %s", c)

    # The capture FAILS: the hold is given back; a second capture wins it.
    conn.execute("UPDATE capture_attempts SET status = 'FAILED' WHERE id = %s", (c,))
    check_eq(q("SELECT held_by, held_by_id FROM payment_attempts WHERE id = %s", a),
             [(None, None)], "the hold after the capture FAILED")
    c2 = step(conn, "capture_attempts", a, amount=600)
    check_eq(claim(conn, "capture_attempts", "capture", a, c2), True, "a second capture")
    with conn.transaction():
        conn.execute("UPDATE payment_attempts SET status = 'SUCCEEDED', captured_amount = 600 "
                     "WHERE id = %s", (a,))
        conn.execute("UPDATE capture_attempts SET status = 'SUCCEEDED', captured_amount = 600 "
                     "WHERE id = %s", (c2,))
    check_eq(q("SELECT status, captured_amount, held_by FROM payment_attempts WHERE id = %s",
               a), [("SUCCEEDED", 600, None)], "the authorization after its capture")
    refused(conn, "a SUCCEEDED capture leaving SUCCEEDED",
            "UPDATE capture_attempts SET status = 'FAILED' WHERE id = %s", c2)
    v3 = step(conn, "void_attempts", a)
    check_eq(claim(conn, "void_attempts", "void", a, v3), False, "a void after the capture")
    refused(conn, "a second SUCCEEDED capture of one authorization",
            "INSERT INTO capture_attempts (id, payment_attempt_id, idempotency_key, "
            "request_fingerprint, status, holds, captured_amount) VALUES "
            "(gen_random_uuid(), %s, 'k-third', 'fp', 'SUCCEEDED', true, 1)", a)

    # Refunds bound by what was captured.
    conn.execute("UPDATE payment_attempts SET refund_reserved = 600 WHERE id = %s", (a,))
    refused(conn, "a refund past what was captured",
            "UPDATE payment_attempts SET refund_reserved = 601 WHERE id = %s", a)

    # A void wins another authorization; it is VOIDED, never captured.
    b, _ = attempt(conn)
    vb = step(conn, "void_attempts", b)
    check_eq(claim(conn, "void_attempts", "void", b, vb), True, "a void first")
    with conn.transaction():
        conn.execute("UPDATE payment_attempts SET status = 'VOIDED' WHERE id = %s", (b,))
        conn.execute("UPDATE void_attempts SET status = 'SUCCEEDED', released_amount = 1000 "
                     "WHERE id = %s", (vb,))
    cb = step(conn, "capture_attempts", b)
    check_eq(claim(conn, "capture_attempts", "capture", b, cb), False, "a capture after a void")
    refused(conn, "a hold on a VOIDED attempt",
            "UPDATE payment_attempts SET held_by = 'capture', held_by_id = %s WHERE id = %s",
            cb, b)

    # One namespace of keys.
    refused(conn, "a capture under a charge's key",
            "INSERT INTO capture_attempts (id, payment_attempt_id, idempotency_key, "
            "request_fingerprint, status) VALUES (gen_random_uuid(), %s, %s, 'fp', 'PENDING')",
            b, "k-" + b)

    steps_succeed(conn)
    hold_rules(conn)
    race(conn, url)


def main():
    base = os.environ["CHARGED_TEST_DATABASE_URL"]
    name = "schema_auth_%d" % os.getpid()
    with psycopg.connect(base, autocommit=True) as admin:
        admin.execute('CREATE DATABASE "%s"' % name)
    url = base.rsplit("/", 1)[0] + "/" + name
    try:
        chargectl = os.path.join(BUILD, "worker", "chargectl", "chargectl")
        p = subprocess.run([chargectl, "migrate"], env=dict(os.environ, DATABASE_URL=url),
                           capture_output=True, timeout=120)
        if p.returncode != 0:
            print("chargectl migrate: %s" % p.stderr.decode()[-800:], file=sys.stderr)
            return 1
        with psycopg.connect(url, autocommit=True) as conn:
            scenario(conn, url)
    finally:
        with psycopg.connect(base, autocommit=True) as admin:
            admin.execute('DROP DATABASE IF EXISTS "%s"' % name)
    if FAILURES:
        print("%d failed" % len(FAILURES), file=sys.stderr)
        return 1
    print("authorize/capture/void schema: all held")
    return 0


if __name__ == "__main__":
    sys.exit(main())
