#!/usr/bin/env python3
"""The production profile's PostgreSQL (deploy/production/postgres.sh: a
primary, a synchronous standby, TLS, SCRAM, PgBouncer in transaction
pooling) loses its primary under load (issue 39), judged from psp-sim's
ledger and the commands topic's committed offsets.

The test starts its own production PostgreSQL (a directory and three free
ports of its own) beside the test stack's Kafka. Two workers and a
reconciler reach it through PgBouncer, the relay and the test's own reads
direct, with the multi-host URL (target_session_attrs=read-write). 400
charges are published; once a third of them settled the primary's
postmaster and every backend are SIGKILLed (`kill-primary`), the group's
committed offsets are read, and the standby is promoted (`promote`: pg_ctl
promote, PgBouncer reloaded onto it). Then:

- every command at an offset the group had committed before the promotion
  has its attempt on the new primary with the outcome the worker persisted
  (not PENDING, not PROCESSING): the worker commits an offset only after
  its outcome's commit, which the synchronous standby had confirmed;
- everything settles through the same PgBouncer, the invariants hold (no
  key charged twice, SUCCEEDED is the provider's ledger, nothing FAILED was
  charged, every offset committed) and the outbox is published."""
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
        base = rnd.randrange(20000, 60000)
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
        self.script("up", timeout=180)
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


def scenario(new):
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
        run(new, pg)
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
        pg.close()


def run(new, pg):
    s = new("pg_failover", partitions=6, psp_args=[
        "--seed", "7", "--latency-ms", "5", "--latency-jitter-ms", "15"],
        worker_env={"WORKER_MAX_IN_FLIGHT": "16"})
    pooled_base, _ = split_url(pg.pooled)
    pooled = pooled_base.rsplit("/", 1)[0] + "/" + s.db.rsplit("/", 1)[1]
    s.worker_env["DATABASE_URL"] = pooled  # the relay's is set direct below
    s.start_worker()
    s.start_worker()
    s.start_reconciler(RECONCILER_POLL_MS="200")
    s.start_relay(RELAY_POLL_MS="100", DATABASE_URL=s.db)
    cmds = [e2e.new_command() for _ in range(N)]
    s.publish(cmds)

    def settled():
        return int(s.query("SELECT count(*) FROM payment_attempts"
                           " WHERE status NOT IN ('PENDING', 'PROCESSING')")[0][0])
    e2e.wait_until("a third of the charges settled", lambda: settled() >= N // 3, 60, 0.05)
    pg.script("kill-primary")
    committed = {p["partition"]: p["committed"] for p in s.lag()["partitions"]}
    pg.script("promote")
    e2e.log("committed offsets when the primary died: %s" % committed)

    # Every committed command's outcome is on the new primary.
    records = [json.loads(line) for line in s.tool("dump", s.topics["commands"]).splitlines()
               if line.strip()]
    done = [json.loads(r["value"])["payment_attempt_id"] for r in records
            if r["offset"] < committed.get(r["partition"], -1)]
    check(len(done) >= N // 4, "only %d commands committed before the kill" % len(done))
    rows = dict(s.query("SELECT id, status FROM payment_attempts WHERE id = ANY('{%s}')"
                        % ",".join(done)))
    lost = [a for a in done if rows.get(a) in (None, "PENDING", "PROCESSING")]
    check(not lost, lambda: "%d of %d commands whose offsets were committed have no outcome "
          "on the new primary: %s" % (len(lost), len(done),
                                      [(a, rows.get(a)) for a in lost[:5]]))
    e2e.log("%d committed commands, every outcome on the new primary" % len(done))

    s.wait_settled(N, timeout=180)
    s.check_invariants()
    e2e.wait_until("the outbox published",
                   lambda: s.query("SELECT count(*) FROM outbox WHERE published_at IS NULL")
                   == [["0"]], 60)


if __name__ == "__main__":
    raise SystemExit(e2e.main(scenario))
