#!/usr/bin/env python3
"""charged behind PgBouncer in transaction pooling (issue 39), judged from
psp-sim's ledger.

A PgBouncer of the test's own (pool_mode = transaction, two server sessions)
stands in front of the stack's PostgreSQL, and the scenarios' core runs
through it: `chargectl migrate`, three workers, a reconciler, 300 charges
with provider faults (dropped answers, errors: attempts go UNKNOWN and are
settled later), two refunds, and a worker SIGKILLed while it holds claimed
attempts. Then:

- the invariants hold (no key charged twice, SUCCEEDED is the provider's
  ledger, nothing FAILED was charged, refunds executed once, every offset
  committed);
- no server session of the pool carries a setting of ours: each is read in
  a transaction of its own (both at once, so both are seen) and its
  statement_timeout, lock_timeout, idle_in_transaction_session_timeout and
  TimeZone are the server's defaults, read on a direct connection. Before
  the settings moved into each transaction (db.c), every charged connection
  set them on whichever server session it was handed, for the next client;
- a relay whose DATABASE_URL goes through the pooler never leads and says
  why (its leadership is a session advisory lock, which a transaction pool
  would hand to other clients); a relay connected direct leads and
  publishes every outbox row. Before, the pooled relay led. An auditor
  through the pooler refuses the lead the same way.

The relay and the auditor are the roles that cannot share a pooled
session; docs/operations.md, "Production settings"."""
import os
import signal
import subprocess

import charged_e2e as e2e
import pgbouncer_e2e
from charged_e2e import check, check_eq

N = 300
SETTINGS = ("statement_timeout", "lock_timeout", "idle_in_transaction_session_timeout",
            "TimeZone")


def claimed_by(s, name):
    return int(s.query("SELECT count(*) FROM payment_attempts WHERE status = 'PROCESSING'"
                       " AND lease_owner = '%s' AND lease_expires_at > now()"
                       % s.worker_ids[name])[0][0])


def scenario(new):
    bouncer = pgbouncer_e2e.PgBouncer(pool_size=2)
    try:
        run(new, bouncer)
    finally:
        e2e.log("PgBouncer log (tail):\n" + "\n".join(bouncer.log().splitlines()[-5:]))
        bouncer.close()


def migrate_through(s, bouncer):
    """Two `chargectl migrate` at once, through the pooler, on a database of
    their own: each file applied once (the lock is a transaction's)."""
    name = s.tag.lower() + "_m"
    s.psql(s.admin_db, 'CREATE DATABASE "%s"' % name)
    env = s.env({"DATABASE_URL": bouncer.url(name)})
    runs = [subprocess.Popen([e2e.CHARGECTL, "migrate"], env=env, stdout=subprocess.PIPE,
                             stderr=subprocess.STDOUT) for _ in range(2)]
    outs = [p.communicate(timeout=e2e.scaled(60))[0].decode() for p in runs]
    for p, out in zip(runs, outs):
        check(p.returncode == 0, "chargectl migrate through PgBouncer exited %d: %s"
              % (p.returncode, out[-1000:]))
    applied = sum(out.count("applied ") for out in outs)
    direct = s.admin_db.rsplit("/", 1)[0] + "/" + name
    rows = int(s.psql(direct, "SELECT count(*) FROM schema_migrations").strip())
    check(rows > 0 and applied == rows,
          "two migrates through the pooler applied %d files in all, the table has %d"
          % (applied, rows))
    e2e.log("two concurrent migrates through PgBouncer: %d files applied once" % rows)


def run(new, bouncer):
    # Calls of 100-150 ms: every worker holds claimed attempts for a while,
    # whatever the machine's speed, so the SIGKILL lands on one.
    s = new("pgbouncer_pool", partitions=6, psp_args=[
        "--seed", "39", "--latency-ms", "100", "--latency-jitter-ms", "50",
        "--fault", "drop_after=0.04", "--fault", "error_before=0.03"],
        worker_env={"WORKER_MAX_IN_FLIGHT": "8"})
    migrate_through(s, bouncer)
    # Every role from here on reaches the Scenario's database through the
    # pooler, but the relay connected direct.
    db_name = s.db.rsplit("/", 1)[1]
    s.worker_env["DATABASE_URL"] = bouncer.url(db_name)

    workers = [s.start_worker() for _ in range(3)]
    s.start_reconciler(RECONCILER_POLL_MS="200")
    # The pooled relay first: given the chance, it would lead.
    pooled_relay = s.start_relay(RELAY_POLL_MS="100")
    pgbouncer_e2e.wait_log(os.path.join(s.dir, pooled_relay + ".log"),
                           "needs a session of its own", 30)
    direct_relay = s.start_relay(RELAY_POLL_MS="100", DATABASE_URL=s.db)
    # The auditor leads the same way, and refuses the same way.
    pooled_auditor = s.start_auditor(AUDITOR_POLL_MS="200")
    pgbouncer_e2e.wait_log(os.path.join(s.dir, pooled_auditor + ".log"),
                           "needs a session of its own", 30)

    cmds = [e2e.new_command(amount=1000 + i) for i in range(N)]
    s.publish(cmds[:N // 2])
    victim = e2e.wait_until("a worker holding claimed attempts",
                            lambda: next((w for w in workers if claimed_by(s, w) > 0), None),
                            60, 0.02)
    e2e.log("SIGKILL", victim, "holding", claimed_by(s, victim), "claimed attempts")
    s.kill_worker(victim, signal.SIGKILL)
    s.start_worker()
    s.publish(cmds[N // 2:])
    s.wait_settled(N, timeout=120)

    paid = [r[0] for r in s.query("SELECT id FROM payment_attempts WHERE status = 'SUCCEEDED'"
                                  " ORDER BY id LIMIT 2")]
    check_eq(len(paid), 2, "charges to refund")
    by_id = {c["payment_attempt_id"]: c for c in cmds}
    s.publish([e2e.new_refund(by_id[paid[0]], 400), e2e.new_refund(by_id[paid[1]], 1000)])
    s.wait_refunds_settled(2, 60)
    e2e.wait_until("every command consumed", lambda: s.lag()["lag"] == 0, 60)

    s.check_invariants()
    s.check_refund_invariants()
    check_eq(sorted(r[0] for r in s.query("SELECT status FROM refund_attempts")),
             ["SUCCEEDED", "SUCCEEDED"], "the two refunds")

    # Every outbox row published, by the direct relay alone.
    e2e.wait_until("the outbox published",
                   lambda: s.query("SELECT count(*) FROM outbox WHERE published_at IS NULL")
                   == [["0"]], 60)
    with open(os.path.join(s.dir, pooled_relay + ".log"), errors="replace") as f:
        pooled_log = f.read()
    check('"msg":"leading' not in pooled_log,
          "the relay behind the transaction pool took the lead: its session lock is on a "
          "server session other clients share")
    with open(os.path.join(s.dir, direct_relay + ".log"), errors="replace") as f:
        check('"msg":"leading' in f.read(), "the relay connected direct never led")
    with open(os.path.join(s.dir, pooled_auditor + ".log"), errors="replace") as f:
        check('"msg":"leading' not in f.read(),
              "the auditor behind the transaction pool took the lead")

    # No setting of ours left on any server session of the pool.
    defaults = dict(zip(SETTINGS, s.psql(s.db, "SELECT " + ", ".join(
        "current_setting('%s')" % name for name in SETTINGS)).strip().split("|")))
    seen = bouncer.server_sessions(db_name, SETTINGS)
    e2e.log("server defaults %s; the pool's server sessions: %s" % (defaults, seen))
    check_eq(len(set(pid for pid, _ in seen)), bouncer.pool_size,
             "distinct server sessions read")
    for pid, values in seen:
        check(values == defaults,
              "server session %d carries another client's session settings %s (the "
              "server's: %s): a session-level SET reached the pool" % (pid, values, defaults))


if __name__ == "__main__":
    raise SystemExit(e2e.main(scenario))
