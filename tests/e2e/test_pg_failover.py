#!/usr/bin/env python3
"""The production profile's PostgreSQL (deploy/production/postgres.sh: a
primary, a synchronous standby, TLS, SCRAM, PgBouncer in transaction
pooling) under faults during load (issue 39), judged from psp-sim's ledger
and the commands topic's committed offsets.

Each scenario starts its own production PostgreSQL (a directory and three
free ports of its own) beside the test stack's Kafka. Two workers and a
reconciler reach it through PgBouncer, the relay and the test's own reads
direct, with the multi-host URL (target_session_attrs=read-write). 400
charges are published; once a third of them settled:

- failover: the primary's postmaster and every backend are SIGKILLed
  (`kill-primary`), the group's committed offsets are read, and the standby
  is promoted (`promote`: pg_ctl promote, PgBouncer reloaded onto it).
  Every command at an offset the group had committed has its attempt on
  the new primary with the outcome the worker persisted (not PENDING, not
  PROCESSING): the worker commits an offset only after its outcome's
  commit, which the synchronous standby had confirmed;
- pgbouncer_restart: PgBouncer is stopped at once and started again
  (`pgbouncer-restart`);
- standby_gone_sync: the standby crashes (`standby-stop`), the primary goes
  on alone (its commits wait for the standby; the workers give their
  statements up at DATABASE_TIMEOUT_MS + 1 s and commit no offset), then
  the primary dies and the standby is started and promoted: nothing whose
  offset was committed is lost;
- standby_gone_async: the same with the standby made asynchronous first
  (`standby-async`): the primary commits alone, the workers commit offsets,
  and after the promotion those outcomes are gone. The scenario asserts
  that the loss is seen: committed offsets without their outcome, and
  psp-sim charges of attempts the new primary has no row of (what the
  auditor reports as charged_unbooked). It must not pass in silence.

Then (but in standby_gone_async) everything settles through the same
PgBouncer, the invariants hold (no key charged twice, SUCCEEDED is the
provider's ledger, nothing FAILED was charged, no charge without its
attempt, every offset committed) and the outbox is published."""
import json
import os
import random
import socket
import subprocess
import tempfile
import shutil

import charged_e2e as e2e
from charged_e2e import check

N = 400
SCRIPT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "deploy",
                      "production", "postgres.sh")


def free_base_port():
    """A port p with p, p+1 and p+2 free on loopback."""
    rnd = random.Random()
    for _ in range(200):
        # Below the kernel's ephemeral range (32768-60999), which a
        # client's connection could take between this look and the bind.
        base = rnd.randrange(20000, 32000)
        try:
            held = []
            for p in range(base, base + 3):
                s = socket.socket()
                held.append(s)
                s.bind(("127.0.0.1", p))
            return base
        except OSError:
            continue
        finally:
            for s in held:
                s.close()
    raise e2e.Failure("no three consecutive free ports")


class ProductionPg:
    def __init__(self):
        self.dir = tempfile.mkdtemp(prefix="charged-prodpg-")
        os.chmod(self.dir, 0o755)
        self.env = dict(os.environ, CHARGED_STACK_DIR=self.dir,
                        CHARGED_PROD_PG_PORT=str(free_base_port()))
        try:
            self.script("up", timeout=180)
        except Exception:
            self.close()
            raise
        urls = {}
        for line in self.script("env").splitlines():
            if line.startswith("export "):
                k, v = line[len("export "):].split("=", 1)
                urls[k] = v.strip("'")
        self.pooled, self.direct = urls["DATABASE_URL"], urls["CHARGED_DATABASE_URL_DIRECT"]

    def script(self, *args, timeout=120):
        p = subprocess.run([SCRIPT] + list(args), env=self.env, capture_output=True,
                           timeout=e2e.scaled(timeout))
        if p.returncode != 0:
            raise e2e.Failure("postgres.sh %s exited %d: %s" % (
                " ".join(args), p.returncode, (p.stdout + p.stderr).decode()[-2000:]))
        e2e.log("postgres.sh", *args, ":", p.stdout.decode().strip().splitlines()[-1:])
        return p.stdout.decode()

    def close(self):
        try:
            self.script("down")
        finally:
            shutil.rmtree(self.dir, ignore_errors=True)


def split_url(url):
    """(URL without its query, {query parameter: value})."""
    base, _, query = url.partition("?")
    return base, dict(kv.split("=", 1) for kv in query.split("&") if kv)


def with_production_pg(new, fn):
    pg = ProductionPg()
    saved = {k: os.environ.get(k) for k in (
        "CHARGED_TEST_DATABASE_URL", "PGSSLMODE", "PGSSLROOTCERT", "PGPASSFILE",
        "PGTARGETSESSIONATTRS")}
    try:
        # Scenario builds its database URLs from CHARGED_TEST_DATABASE_URL's
        # path alone: the TLS, the passfile and the read-write target travel
        # as libpq's environment, which every client of the test inherits.
        direct, params = split_url(pg.direct)
        os.environ.update({"CHARGED_TEST_DATABASE_URL": direct,
                           "PGSSLMODE": params["sslmode"],
                           "PGSSLROOTCERT": params["sslrootcert"],
                           "PGPASSFILE": params["passfile"],
                           "PGTARGETSESSIONATTRS": params["target_session_attrs"]})
        fn(new, pg)
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
        pg.close()


def start_fleet(new, pg, name, **env):
    """A Scenario on pg: two workers and a reconciler through PgBouncer, a
    relay direct; N commands published, and a third of them settled. Paced
    by the provider (2 workers x 8 calls of 100-115 ms: ~150/s), so that the
    load outlasts the fault that follows whatever the machine's speed."""
    latency_ms, in_flight = 100, 8
    s = new(name, partitions=6, psp_args=[
        "--seed", "7", "--latency-ms", str(latency_ms), "--latency-jitter-ms", "15"],
        worker_env=dict({"WORKER_MAX_IN_FLIGHT": str(in_flight)}, **env))
    pooled_base, _ = split_url(pg.pooled)
    s.worker_env["DATABASE_URL"] = pooled_base.rsplit("/", 1)[0] + "/" + s.db.rsplit("/", 1)[1]
    s.start_worker()
    s.start_worker()
    s.start_reconciler(RECONCILER_POLL_MS="200")
    s.start_relay(RELAY_POLL_MS="100", DATABASE_URL=s.db)
    s.publish([e2e.new_command() for _ in range(N)])
    e2e.wait_until("a third of the charges settled", lambda: settled(s) >= N // 3, 60, 0.05)
    return s


def settled(s):
    return int(s.query("SELECT count(*) FROM payment_attempts"
                       " WHERE status NOT IN ('PENDING', 'PROCESSING')")[0][0])


def unbooked_charges(s):
    """psp-sim's charges of attempts the database has no row of."""
    ids = {r[0] for r in s.query("SELECT id FROM payment_attempts")}
    return [c for c in s.ledger() if not c.get("injected") and
            c.get("payment_attempt_id") and c["payment_attempt_id"] not in ids]


def finish(s):
    s.wait_settled(N, timeout=180)
    s.check_invariants()
    unbooked = unbooked_charges(s)
    check(not unbooked, lambda: "psp-sim charged %d attempts with no row: %s"
          % (len(unbooked), [c["payment_attempt_id"] for c in unbooked[:5]]))
    e2e.wait_until("the outbox published",
                   lambda: s.query("SELECT count(*) FROM outbox WHERE published_at IS NULL")
                   == [["0"]], 60)


def failover(new):
    with_production_pg(new, kill_and_promote)


def committed_outcomes_lost(s, committed):
    """The commands at offsets the group had committed (committed: partition
    -> offset) whose attempt has no outcome on the database now: (how many
    committed, [(attempt id, status or None)] of those lost)."""
    records = [json.loads(line) for line in s.tool("dump", s.topics["commands"]).splitlines()
               if line.strip()]
    done = [json.loads(r["value"])["payment_attempt_id"] for r in records
            if r["offset"] < committed.get(r["partition"], -1)]
    rows = dict(s.query("SELECT id, status FROM payment_attempts WHERE id = ANY('{%s}')"
                        % ",".join(done)))
    return len(done), [(a, rows.get(a)) for a in done
                       if rows.get(a) in (None, "PENDING", "PROCESSING")]


def kill_and_promote(new, pg):
    s = start_fleet(new, pg, "pg_failover")
    check(settled(s) < N, "the load was over before the primary died")
    pg.script("kill-primary")
    committed = {p["partition"]: p["committed"] for p in s.lag()["partitions"]}
    pg.script("promote")
    e2e.log("committed offsets when the primary died: %s" % committed)
    # Every committed command's outcome is on the new primary.
    n, lost = committed_outcomes_lost(s, committed)
    check(n >= N // 4, "only %d commands committed before the kill" % n)
    check(not lost, lambda: "%d of %d commands whose offsets were committed have no outcome "
          "on the new primary: %s" % (len(lost), n, lost[:5]))
    e2e.log("%d committed commands, every outcome on the new primary" % n)
    finish(s)


def standby_gone(new, pg, synchronous):
    """The standby stops (a crash) under load, the primary goes on alone for
    a while, then dies; the standby comes back and is promoted: it has
    nothing the primary committed after it stopped. Synchronous, the
    primary committed nothing in that while (each commit waits for the
    standby; the workers give a statement up at their deadline and commit
    no offset): nothing is lost. Asynchronous, the workers commit offsets
    for outcomes only the dead primary had: the check must see them lost,
    and psp-sim's ledger charges nobody booked."""
    s = start_fleet(new, pg, "standby_gone_" + ("sync" if synchronous else "async"),
                    DATABASE_TIMEOUT_MS="1000")
    if not synchronous:
        pg.script("standby-async")
    pg.script("standby-stop")
    at_stop = settled(s)
    check(at_stop < N - 50, "the load was over before the standby stopped")
    if synchronous:
        def given_up():
            for name in s.workers:
                with open(os.path.join(s.dir, name + ".log"), errors="replace") as f:
                    if "did not answer within" in f.read():
                        return True
            return False
        e2e.wait_until("a worker's statement given up at its deadline", given_up, 30)
    else:
        e2e.wait_until("50 more settled on the primary alone",
                       lambda: settled(s) >= min(N, at_stop + 50), 30, 0.05)
    pg.script("kill-primary")
    committed = {p["partition"]: p["committed"] for p in s.lag()["partitions"]}
    pg.script("standby-start")
    pg.script("promote")
    n, lost = committed_outcomes_lost(s, committed)
    e2e.log("%s standby: %d commands committed, %d of them without their outcome on the "
            "new primary" % ("synchronous" if synchronous else "asynchronous", n, len(lost)))
    if synchronous:
        check(not lost, lambda: "%d of %d commands whose offsets were committed have no "
              "outcome on the new primary: %s" % (len(lost), n, lost[:5]))
        finish(s)
        return
    check(lost, "an asynchronous standby lost nothing the primary committed alone: the "
          "scenario did not make the loss it shows")
    # What the auditor reports as charged_unbooked: the provider charged
    # attempts the new primary has no row of. (Scenario.check_invariants
    # judges the charges of attempts it finds, so it does not see these.)
    unbooked = unbooked_charges(s)
    check(unbooked, "an asynchronous standby lost committed outcomes, yet every charge of "
          "psp-sim's ledger has its attempt")
    e2e.log("psp-sim charged %d attempts the new primary has no row of" % len(unbooked))


def standby_gone_sync(new):
    with_production_pg(new, lambda new, pg: standby_gone(new, pg, True))


def standby_gone_async(new):
    with_production_pg(new, lambda new, pg: standby_gone(new, pg, False))


def pgbouncer_restart(new):
    with_production_pg(new, restart_pooler)


def restart_pooler(new, pg):
    """PgBouncer stopped at once (SIGINT: every client connection dropped,
    transactions in flight rolled back by the server) and started again,
    under load: the workers come back through it and nothing is lost or
    charged twice."""
    s = start_fleet(new, pg, "pgbouncer_restart")
    before = settled(s)
    check(before < N, "the load was over before PgBouncer restarted")
    pg.script("pgbouncer-restart")
    e2e.log("PgBouncer restarted with %d of %d settled" % (before, N))
    finish(s)
    # The restart reached the workers: a statement of theirs failed on it.
    failed = 0
    for name in s.workers:
        with open(os.path.join(s.dir, name + ".log"), errors="replace") as f:
            failed += f.read().count('"msg":"database step failed')
    check(failed > 0, "no worker saw PgBouncer go: the fault missed the load")


if __name__ == "__main__":
    raise SystemExit(e2e.main(e2e.run_scenarios([failover, standby_gone_sync, standby_gone_async, pgbouncer_restart])))
