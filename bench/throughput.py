#!/usr/bin/env python3
"""The throughput benchmark of issue 22, in one invocation on one stack:

  pgbench     pgbench -N, 8 clients, on its own database of the same server:
              the TPS baseline
  naive       bench/naive_consumer: one message at a time (charge, one
              transaction, synchronous offset commit)
  charged     `charged worker` at 0 and 100 ms provider latency, 1 and 2
              workers; commands published first, the clock measures settling
  baseline    the 0 ms, 1 worker run with the worker of --baseline-commit
              (e1a768a), built once into the build tree: the CPU goal's
              reference, measured in the same invocation
  walcomp     the 0 ms, 1 worker run again with wal_compression=lz4
  latency     1 worker, 100 ms provider, commands produced at a steady half
              of the 1-worker 100 ms rate, then at 250/s: Kafka CreateTime
              -> outcome row
  rss         peak RSS with 64 .. 5,000 provider calls in flight
  breaker     20% 5xx (10% before, 10% after executing), breaker off vs default

For every charged run: charges/s, CPU seconds per 1,000 charges by process,
the worker's peak RSS, statements and WAL bytes per charge and the top
statements (pg_stat_statements). At the end: every goal's ratio, PASS/MISS;
JSON to --out, a PNG chart beside it (or to --chart). docs/performance.md
says what each number means and how it is taken.

Needs the test stack (deploy/stack.sh up, with pg_stat_statements loaded):
CHARGED_TEST_DATABASE_URL, CHARGED_TEST_KAFKA, CHARGED_BUILD_DIR (see
bench/worker_throughput.py).

  python3 bench/throughput.py [--quick] [--n N] [--skip part,...] [--out PATH]
"""
import argparse
import datetime
import json
import os
import platform
import re
import resource
import statistics
import subprocess
import sys
import time
import urllib.parse

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
sys.path.insert(0, os.path.join(REPO, "tests", "e2e"))
sys.path.insert(0, HERE)
import charged_e2e as e2e  # noqa: E402
import png_chart  # noqa: E402

PARTS = ("pgbench", "naive", "charged", "baseline", "walcomp", "latency", "rss", "breaker")
# The worker the loop's CPU goal is judged against (issue 40: "<= 0.5x
# e1a768a's in the same run"): built from that commit, run beside.
BASELINE_COMMIT = "e1a768a"
NAIVE = os.path.join(e2e.BUILD, "bench", "naive_consumer")
CLK = os.sysconf("SC_CLK_TCK")
MIB = 1024 * 1024
BIG_IN_FLIGHT = 5000  # WORKER_MAX_IN_FLIGHT of the charged runs
FAULTS = ["--seed", "20261201", "--fault", "error_before=0.1", "--fault", "error_after=0.1"]
log = e2e.log


class Failure(e2e.Failure):
    pass


def run_cmd(argv, timeout, **kw):
    """subprocess.run with a deadline; Failure on timeout or a non-zero exit."""
    try:
        p = subprocess.run(argv, capture_output=True, timeout=timeout, **kw)
    except subprocess.TimeoutExpired:
        raise Failure("%s did not finish within %ss" % (" ".join(argv[:3]), timeout))
    if p.returncode != 0:
        raise Failure("%s exited %d: %s" % (" ".join(argv[:3]), p.returncode,
                                            (p.stdout + p.stderr).decode()[-2000:]))
    return p


class Scenario(e2e.Scenario):
    """The harness's scenario, with a deadline on every subprocess."""

    def run(self, argv, stdin=None, check=True, extra_env=None, timeout=300):
        try:
            p = subprocess.run(argv, input=stdin, capture_output=True, env=self.env(extra_env),
                               timeout=e2e.scaled(timeout))
        except subprocess.TimeoutExpired:
            raise Failure("%s did not finish within %ss" % (argv[:3], timeout))
        if check and p.returncode != 0:
            raise Failure("%s exited %d: %s" % (argv[:3], p.returncode, p.stderr.decode()[-2000:]))
        return p

    def attempts(self):
        """The harness's attempts, less the rows PREFILL_SQL wrote (no charge of
        this run: the invariants are about this run's)."""
        return [a for a in super().attempts() if not a["ppid"].startswith("pi_prefill_")]

    def psql(self, url, sql):
        return run_cmd(["psql", "-X", "-q", "-tA", "-v", "ON_ERROR_STOP=1", url, "-c", sql],
                       timeout=e2e.scaled(300)).stdout.decode()


# ---- processes: CPU and memory from /proc ----

def proc_stat(pid):
    """{ppid, cpu (utime+stime), ccpu (cutime+cstime)} in seconds, or None if gone."""
    try:
        with open("/proc/%d/stat" % pid) as f:
            rest = f.read().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None
    return {"ppid": int(rest[1]), "cpu": (int(rest[11]) + int(rest[12])) / CLK,
            "ccpu": (int(rest[13]) + int(rest[14])) / CLK}


def proc_kib(pid, key):
    """VmHWM, VmRSS... of /proc/<pid>/status in KiB, or None."""
    try:
        with open("/proc/%d/status" % pid) as f:
            for line in f:
                if line.startswith(key + ":"):
                    return int(line.split()[1])
    except OSError:
        pass
    return None


def machine_cpu():
    """Busy CPU seconds of the whole machine, every core (/proc/stat: all but
    idle and iowait)."""
    with open("/proc/stat") as f:
        v = [int(x) for x in f.readline().split()[1:]]
    return (sum(v[:8]) - v[3] - v[4]) / CLK


def all_pids():
    return [int(d) for d in os.listdir("/proc") if d.isdigit()]


def listening_pid(port):
    """The pid of the process with a TCP socket listening on port (IPv4 or 6)."""
    inodes = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            with open(table) as f:
                next(f)
                for line in f:
                    cols = line.split()
                    if cols[3] == "0A" and int(cols[1].rsplit(":", 1)[1], 16) == port:
                        inodes.add(cols[9])
        except OSError:
            continue
    for pid in all_pids():
        try:
            for fd in os.listdir("/proc/%d/fd" % pid):
                link = os.readlink("/proc/%d/fd/%s" % (pid, fd))
                if link.startswith("socket:[") and link[8:-1] in inodes:
                    return pid
        except OSError:
            continue
    return None


class PgCpu:
    """CPU of the whole PostgreSQL server: the postmaster's own time, plus what
    its exited children used (its cutime+cstime: the postmaster reaps every
    backend), plus the time of its live children. The difference of two
    samples is what the server used in between, backends that came and went
    included."""

    def __init__(self, postmaster):
        self.pid = postmaster

    def sample(self):
        pm = proc_stat(self.pid)
        if pm is None:
            raise Failure("the postmaster (pid %d) is gone" % self.pid)
        total = pm["cpu"] + pm["ccpu"]
        for pid in all_pids():
            st = proc_stat(pid)
            if st and st["ppid"] == self.pid:
                total += st["cpu"]
        return total


# ---- PostgreSQL as its superuser ----

def url_as(url, user, dbname):
    u = urllib.parse.urlsplit(url)
    host = u.hostname + (":%d" % u.port if u.port else "")
    return urllib.parse.urlunsplit((u.scheme, "%s@%s" % (user, host), "/" + dbname, u.query, ""))


class Pg:
    """One superuser session on the server (stack.sh's trust auth over
    127.0.0.1, as `postgres`): pg_stat_statements, WAL position, CPU."""

    def __init__(self, base_url):
        self.base = base_url
        self.url = url_as(base_url, "postgres", "postgres")
        self.s = e2e.Session(self.url)
        self.postmaster = proc_stat(self.s.pid)["ppid"]
        self.cpu = PgCpu(self.postmaster)
        self.version = self.one("SHOW server_version")
        self.wal_compression = self.one("SHOW wal_compression")  # what RESET goes back to
        self.pss = self.has_pss()

    def one(self, sql):
        rows = self.s.run(sql, timeout=120)
        return "|".join(rows[0]) if rows else None

    def has_pss(self):
        loaded = "pg_stat_statements" in self.one("SHOW shared_preload_libraries")
        if not loaded:
            log("NOTE: PostgreSQL at %s runs without pg_stat_statements in "
                "shared_preload_libraries: no statement statistics this run. deploy/stack.sh "
                "loads it at start; restart the stack to get them: deploy/stack.sh down && "
                "deploy/stack.sh up" % self.url)
            return False
        if not self.one("SELECT 1 FROM pg_available_extensions WHERE name = 'pg_stat_statements'"):
            log("NOTE: pg_stat_statements is loaded but its extension files are missing "
                "(Debian ships them in postgresql-NN): no statement statistics this run")
            return False
        self.one("CREATE EXTENSION IF NOT EXISTS pg_stat_statements")
        if self.one("SHOW pg_stat_statements.track") != "all":
            log("NOTE: pg_stat_statements.track is not 'all': statements inside functions "
                "are not counted")
        return True

    def lsn(self):
        return self.one("SELECT pg_current_wal_lsn()")

    def wal_diff(self, a, b):
        return int(float(self.one("SELECT pg_wal_lsn_diff('%s', '%s')" % (b, a))))

    def reset(self):
        if self.pss:
            self.one("SELECT pg_stat_statements_reset()")

    def statements(self, dbname, user="charged"):
        """The scenario's statements (its database, the role its daemons use;
        the bench's own polling runs as postgres and is left out)."""
        if not self.pss:
            return None
        out = self.one(
            "SELECT coalesce(jsonb_agg(jsonb_build_object("
            " 'queryid', queryid::text, 'toplevel', toplevel, 'calls', calls, 'rows', rows,"
            " 'total_ms', total_exec_time, 'mean_ms', mean_exec_time,"
            " 'wal_bytes', wal_bytes::bigint, 'wal_fpi', wal_fpi,"
            " 'query', left(regexp_replace(query, '\\s+', ' ', 'g'), 2000))"
            " ORDER BY total_exec_time DESC), '[]')::text"
            " FROM pg_stat_statements s JOIN pg_database d ON d.oid = s.dbid"
            " JOIN pg_roles r ON r.oid = s.userid"
            " WHERE d.datname = '%s' AND r.rolname = '%s'" % (dbname, user))
        return json.loads(out)

    def set_wal_compression(self, value):
        """ALTER SYSTEM + reload: wal_compression takes effect without a restart."""
        if value is None:
            self.one("ALTER SYSTEM RESET wal_compression")
        else:
            self.one("ALTER SYSTEM SET wal_compression = '%s'" % value)
        self.one("SELECT pg_reload_conf()")
        want = value or self.wal_compression
        e2e.wait_until("wal_compression = %s" % want, lambda: run_cmd(
            ["psql", "-X", "-tA", self.url, "-c", "SHOW wal_compression"],
            timeout=30).stdout.decode().strip() == want, 20)

    def close(self):
        self.s.close()


def statement_name(q):
    """A short name for a statement: the tables it writes, else what it reads."""
    writes = []
    for m in re.finditer(r"(?<!FOR )\b(INSERT INTO|UPDATE|DELETE FROM)\s+([a-z_][a-z_0-9.]*)",
                         q, re.I):
        if m.group(2).upper() in ("OF", "SKIP", "NOWAIT"):  # FOR [NO KEY] UPDATE OF ...
            continue
        w = "%s %s" % (m.group(1).split()[0].upper(), m.group(2))
        if w not in writes:
            writes.append(w)
    if writes:
        return " + ".join(writes)
    m = re.search(r"\bFROM\s+([a-z_][a-z_0-9.]*)", q, re.I)
    head = q.strip().split(" ", 1)[0].upper()
    return "%s %s" % (head, m.group(1)) if m else q.strip()[:40]


def summarize_statements(stmts, n):
    if stmts is None:
        return None
    top = [s for s in stmts if s["toplevel"]]
    nested = [s for s in stmts if not s["toplevel"]]
    total_ms = sum(s["total_ms"] for s in top) or 1e-9
    rows = []
    for s in top[:10]:
        rows.append({"name": statement_name(s["query"]), "calls": s["calls"], "rows": s["rows"],
                     "total_ms": round(s["total_ms"], 1), "mean_ms": round(s["mean_ms"], 3),
                     "share": round(s["total_ms"] / total_ms, 4), "wal_bytes": s["wal_bytes"],
                     "wal_fpi": s["wal_fpi"], "queryid": s["queryid"], "query": s["query"][:600]})
    calls = sum(s["calls"] for s in top)
    return {"calls": calls, "per_charge": calls / n, "nested_calls": sum(s["calls"] for s in nested),
            "total_ms": round(total_ms, 1), "db_ms_per_charge": total_ms / n,
            "wal_bytes": sum(s["wal_bytes"] for s in top),
            "wal_bytes_per_charge": sum(s["wal_bytes"] for s in top) / n, "top": rows}


# ---- one measured window ----

class Window:
    """CPU of PostgreSQL, the broker and psp-sim, WAL and statements, between
    start() (after a CHECKPOINT and a pg_stat_statements reset) and stop()."""

    def __init__(self, ctx, psp_pid=None):
        self.ctx, self.psp_pid = ctx, psp_pid

    def start(self):
        pg = self.ctx.pg
        pg.one("CHECKPOINT")  # every run starts after one: full-page images alike
        pg.reset()
        self.lsn0 = pg.lsn()
        self.pg0 = pg.cpu.sample()
        self.kafka0 = proc_stat(self.ctx.kafka_pid)["cpu"]
        self.psp0 = proc_stat(self.psp_pid)["cpu"] if self.psp_pid else None
        self.machine0 = machine_cpu()
        self.t0 = time.time()

    def stop(self, n, dbname, user="charged"):
        pg = self.ctx.pg
        self.t1 = time.time()
        cpu = {"postgres": pg.cpu.sample() - self.pg0,
               "kafka": proc_stat(self.ctx.kafka_pid)["cpu"] - self.kafka0}
        if self.psp_pid:
            cpu["psp_sim"] = proc_stat(self.psp_pid)["cpu"] - self.psp0
        self.machine = machine_cpu() - self.machine0
        wal = pg.wal_diff(self.lsn0, pg.lsn())
        stm = summarize_statements(pg.statements(dbname, user), n)
        return {"cpu_s": cpu, "wal_bytes": wal, "wal_bytes_per_charge": wal / n,
                "statements": stm, "machine_cpu_s": self.machine,
                "window_s": self.t1 - self.t0}


def add_other(rec):
    """What the machine's cores did besides the processes measured: this
    bench itself, and whatever else shares the machine."""
    rec["cpu_s"]["other"] = rec.pop("machine_cpu_s") - sum(rec["cpu_s"].values())


def per_1000(cpu, n):
    return {k: round(v * 1000.0 / n, 3) for k, v in cpu.items()}


# ---- waiting for the worker to settle ----

def wait_settled(s, watch, n, timeout, each=None):
    """Until n attempts exist, none PENDING or claimed, and the group's lag
    is 0; polled in one superuser session (left out of the statements).
    Returns the time (time.time()) it was seen."""
    deadline = time.monotonic() + e2e.scaled(timeout)
    last_log = last_db = time.monotonic()
    total = open_ = 0
    while True:
        if each:
            each()
        # The workers' own count first (cheap, not the database's time), the
        # table at least once a second and whenever that count says done.
        processed = 0
        for name in s.workers:
            try:
                processed += sum(v for k, v in s.admin_metrics(name).items()
                                 if k.startswith("charged_attempts_processed_total"))
            except (OSError, e2e.Failure):
                pass  # not listening yet
        if processed < n and time.monotonic() - last_db < 1:
            time.sleep(0.1)
            continue
        last_db = time.monotonic()
        total, open_ = (int(v) for v in watch.run(
            "SELECT count(*), count(*) FILTER (WHERE status = 'PENDING' OR (status = "
            "'PROCESSING' AND lease_owner IS NOT NULL)) FROM payment_attempts"
            " WHERE provider_payment_id IS NULL OR provider_payment_id NOT LIKE 'pi_prefill_%'"
            )[0])
        if total >= n and open_ == 0 and s.lag()["lag"] == 0:
            return time.time()
        for name, p in s.workers.items():
            if p.poll() is not None:
                raise Failure("worker %s exited %s; see %s" % (name, p.returncode, s.dir))
        if time.monotonic() > deadline:
            raise Failure("not settled within %ss: %d attempts, %d open" % (timeout, total, open_))
        if time.monotonic() - last_log > 10:
            last_log = time.monotonic()
            log("waiting: %d of %d attempts, %d open" % (total, n, open_))
        time.sleep(0.1)


def db_span(watch):
    """First attempt row written, last outcome persisted (DB clock, s since the epoch)."""
    a, b = watch.run("SELECT extract(epoch FROM min(created_at)), extract(epoch FROM "
                     "max(updated_at)) FROM payment_attempts WHERE provider_payment_id IS NULL"
                     " OR provider_payment_id NOT LIKE 'pi_prefill_%'")[0]
    return float(a), float(b)


class Ctx:
    def __init__(self, args):
        self.args = args
        self.base_url = os.environ["CHARGED_TEST_DATABASE_URL"]
        self.kafka = os.environ["CHARGED_TEST_KAFKA"]
        self.pg = Pg(self.base_url)
        self.kafka_pid = listening_pid(int(self.kafka.split(",")[0].rsplit(":", 1)[1]))
        if not self.kafka_pid:
            raise Failure("no process listens on the Kafka port of %s" % self.kafka)
        self.open = []

    def scenario(self, label, **kw):
        s = Scenario("bench_" + label, **kw)
        self.open.append(s)
        return s

    def done(self, s):
        s.close()
        self.open.remove(s)
        if not self.args.keep_databases:  # its autovacuum would add to later runs' WAL and CPU
            self.drop_database(s.tag.lower())

    def drop_database(self, name):
        try:
            run_cmd(["psql", "-X", "-q", "-v", "ON_ERROR_STOP=1", self.pg.url, "-c",
                     'DROP DATABASE IF EXISTS "%s" WITH (FORCE)' % name], timeout=120)
        except Failure as e:
            log("could not drop database %s: %s" % (name, e))


def worker_cpu_rss(s, names):
    cpu, hwm = 0.0, 0
    for name in names:
        pid = s.workers[name].pid
        cpu += proc_stat(pid)["cpu"]
        hwm = max(hwm, proc_kib(pid, "VmHWM") or 0)
    return cpu, hwm


def finish(s, watch, names, n, win, t_start, t_end, **extra):
    """The record of a charged run, once settled (workers still running)."""
    wcpu, hwm = worker_cpu_rss(s, names)
    first, last = db_span(watch)
    rec = {"n": n, "workers": len(names), "seconds": t_end - first, "rate": n / (t_end - first),
           "seconds_wall": t_end - t_start, "rate_wall": n / (t_end - t_start),
           "first_row_after_start_s": first - t_start, "last_outcome_before_settled_s": t_end - last,
           "worker_peak_rss_kib": hwm}
    rec.update(win.stop(n, s.tag.lower()))
    rec["cpu_s"]["worker"] = wcpu
    add_other(rec)
    rec["cpu_s_per_1000"] = per_1000(rec["cpu_s"], n)
    rec.update(extra)
    return rec


PREFILL_SQL = (
    "INSERT INTO payment_attempts (id, order_id, idempotency_key, request_fingerprint, amount,"
    " currency, payment_method, status, provider_payment_id, attempt_count, created_at,"
    " updated_at)"
    " SELECT u, gen_random_uuid(), 'attempt:' || u, md5(u::text), 1000, 'EUR',"
    " 'pm_card_visa', 'SUCCEEDED', 'pi_prefill_' || i, 1, now() - interval '1 day',"
    " now() - interval '1 day'"
    " FROM (SELECT gen_random_uuid() AS u, i FROM generate_series(1, %d) AS i) AS g")


def charged_run(ctx, label, n, latency_ms, workers=1, in_flight=BIG_IN_FLIGHT, psp_args=(),
                env=None, timeout=None, prefill=0):
    """prefill: settled attempts written (by SQL) before the run, so that the
    run's writes land in pages that exist before its checkpoint, as in a
    database that has been in service (their full-page images are what
    wal_compression compresses); left out of the run's counts."""
    s = ctx.scenario(label, psp_args=["--latency-ms", str(latency_ms)] + list(psp_args))
    if prefill:
        s.psql(s.db, PREFILL_SQL % prefill)
        s.psql(s.db, "VACUUM (ANALYZE) payment_attempts")
    s.publish([e2e.new_command() for _ in range(n)])  # first: the clock measures settling
    watch = e2e.Session(url_as(s.db, "postgres", s.tag.lower()))
    win = Window(ctx, s.psp.pid)
    win.start()
    t_start = time.time()
    names = []
    for _ in range(workers):
        port = e2e.free_port()
        names.append(s.start_worker(WORKER_MAX_IN_FLIGHT=in_flight, LOG_LEVEL="warn",
                                    ADMIN_ADDR="127.0.0.1:%d" % port, **(env or {})))
        s.admin_ports[names[-1]] = port
    t_end = wait_settled(s, watch, n, timeout or max(180, n / 20))
    rec = finish(s, watch, names, n, win, t_start, t_end, latency_ms=latency_ms,
                 max_in_flight=in_flight)
    watch.close()
    rec["statuses"] = s.check_invariants()
    ctx.done(s)
    log("%s: %d charges in %.2f s: %.0f/s (%.0f/s from the worker's start); peak RSS %.1f MiB"
        % (label, n, rec["seconds"], rec["rate"], rec["rate_wall"], hwm_mib(rec)))
    return rec


def build_baseline(commit):
    """The `charged` binary of commit, built once into the build tree
    (bench/baseline-<commit>/): its source from `git archive`, configured and
    built as the project builds itself. Its path."""
    root = os.path.join(e2e.BUILD, "bench", "baseline-" + commit)
    # The binary moved with the folders (roles/ until the house issue).
    places = [os.path.join(root, "build", d, "charged") for d in ("worker", "roles")]

    def built():
        return next((b for b in places if os.path.isfile(b)), None)
    if built():
        return built()
    src = os.path.join(root, "src")
    os.makedirs(src, exist_ok=True)
    archive = subprocess.run(["git", "-C", REPO, "archive", commit], capture_output=True,
                             timeout=120)
    if archive.returncode != 0:
        raise Failure("git archive %s: %s" % (commit, archive.stderr.decode()[-500:]))
    run_cmd(["tar", "-x", "-C", src], 120, input=archive.stdout)
    log("baseline: building %s's worker in %s" % (commit, root))
    run_cmd(["cmake", "-S", src, "-B", os.path.join(root, "build")], 600)
    run_cmd(["cmake", "--build", os.path.join(root, "build"), "-j2", "--target", "charged"],
            1800)
    if not built():
        raise Failure("baseline %s built no charged binary in %s" % (commit, places))
    return built()


def baseline_run(ctx, commit, n):
    """The 0 ms, 1 worker run with commit's worker binary (this build's
    migrations, psp-sim and Kafka tools): the same commands, the same
    stack, one after the other."""
    binary = build_baseline(commit)
    mine = e2e.CHARGED
    e2e.CHARGED = binary
    try:
        rec = charged_run(ctx, "0ms_1w_baseline", n, 0)
    finally:
        e2e.CHARGED = mine
    rec["baseline_commit"] = commit
    return rec


def hwm_mib(rec):
    return rec["worker_peak_rss_kib"] / 1024.0


# ---- the parts ----

def part_pgbench(ctx, seconds, scale):
    db = "bench_pgbench"
    ctx.pg.one("DROP DATABASE IF EXISTS %s" % db)
    ctx.pg.one("CREATE DATABASE %s OWNER charged" % db)
    u = urllib.parse.urlsplit(ctx.base_url)
    conn = ["-h", u.hostname, "-p", str(u.port or 5432), "-U", u.username or "charged"]
    log("pgbench: initialising scale %d" % scale)
    run_cmd(["pgbench", "-i", "-q", "-s", str(scale)] + conn + [db], timeout=600)
    win = Window(ctx)
    win.start()
    ru0 = resource.getrusage(resource.RUSAGE_CHILDREN)
    p = run_cmd(["pgbench", "-N", "-n", "-c", "8", "-j", "2", "-T", str(seconds)] + conn + [db],
                timeout=seconds + 120)
    ru1 = resource.getrusage(resource.RUSAGE_CHILDREN)
    out = p.stdout.decode()
    tps = float(re.search(r"tps = ([0-9.]+) \(without initial connection time\)", out).group(1))
    txs = int(re.search(r"number of transactions actually processed: (\d+)", out).group(1))
    rec = win.stop(txs, db)
    rec["cpu_s"]["pgbench"] = (ru1.ru_utime + ru1.ru_stime) - (ru0.ru_utime + ru0.ru_stime)
    add_other(rec)
    rec.update({"tps": tps, "transactions": txs, "seconds": seconds, "scale": scale,
                "clients": 8, "threads": 2, "cpu_s_per_1000": per_1000(rec["cpu_s"], txs)})
    log("pgbench -N -c 8 -j 2 -T %d: %.0f TPS" % (seconds, tps))
    if not ctx.args.keep_databases:
        ctx.drop_database(db)
    return rec


def part_naive(ctx, n):
    s = ctx.scenario("naive")
    s.publish([e2e.new_command() for _ in range(n)])
    win = Window(ctx, s.psp.pid)
    win.start()
    t_start = time.time()
    env = s.env({"NAIVE_MAX_MESSAGES": str(n)})
    p = subprocess.Popen([NAIVE], stdout=subprocess.PIPE, stderr=open(
        os.path.join(s.dir, "naive.log"), "ab"), env=env)
    ru0 = resource.getrusage(resource.RUSAGE_CHILDREN)
    try:
        out, _ = p.communicate(timeout=e2e.scaled(max(120, n / 10)))
    except subprocess.TimeoutExpired:
        p.kill()
        p.wait(timeout=30)
        raise Failure("naive_consumer did not handle %d messages in time; see %s" % (n, s.dir))
    t_end = time.time()
    if p.returncode != 0:
        raise Failure("naive_consumer exited %d; see %s" % (p.returncode, s.dir))
    own = json.loads(out.decode().strip().splitlines()[-1])
    watch = e2e.Session(url_as(s.db, "postgres", s.tag.lower()))
    first = float(watch.run("SELECT extract(epoch FROM min(created_at)) FROM naive.attempts")[0][0])
    watch.close()
    ru1 = resource.getrusage(resource.RUSAGE_CHILDREN)  # the consumer is the one reaped
    rec = win.stop(n, s.tag.lower())
    rec["cpu_s"]["naive"] = (ru1.ru_utime + ru1.ru_stime) - (ru0.ru_utime + ru0.ru_stime)
    add_other(rec)
    check_lag = s.lag()["lag"]
    rec.update({"n": n, "handled": own, "seconds": t_end - first, "rate": n / (t_end - first),
                "seconds_wall": t_end - t_start, "rate_wall": n / (t_end - t_start),
                "lag_after": check_lag})
    rec["cpu_s_per_1000"] = per_1000(rec["cpu_s"], n)
    ctx.done(s)
    log("naive consumer: %d charges in %.2f s: %.0f/s" % (n, rec["seconds"], rec["rate"]))
    return rec


def part_latency(ctx, rate, seconds, latency_ms=100):
    n = max(1, int(rate * seconds))
    s = ctx.scenario("latency", psp_args=["--latency-ms", str(latency_ms)])
    port = e2e.free_port()
    w = s.start_worker(WORKER_MAX_IN_FLIGHT=BIG_IN_FLIGHT, LOG_LEVEL="warn",
                       ADMIN_ADDR="127.0.0.1:%d" % port)
    s.admin_ports[w] = port
    def ready():
        try:
            return s.admin_get(w, "/readyz")[0] == 200
        except OSError:
            return False  # not listening yet
    e2e.wait_until("the worker ready (it holds the partitions)", ready, 60)
    watch = e2e.Session(url_as(s.db, "postgres", s.tag.lower()))
    win = Window(ctx, s.psp.pid)
    win.start()
    t_start = time.time()
    producer = subprocess.Popen([e2e.KAFKA_TOOL, "produce", s.topics["commands"]],
                                stdin=subprocess.PIPE, stdout=subprocess.DEVNULL,
                                stderr=subprocess.PIPE, env=s.env())
    t0, i = time.monotonic(), 0
    log("latency: producing %d commands at %.0f/s for %.0f s" % (n, rate, seconds))
    while i < n:  # rate-paced: each tick sends what is due by then
        due = min(n, int((time.monotonic() - t0) * rate) + 1)
        if due > i:
            lines = []
            for _ in range(due - i):
                c = e2e.new_command()
                lines.append(json.dumps({"key": c["payment_attempt_id"], "value": json.dumps(c)}))
            producer.stdin.write(("\n".join(lines) + "\n").encode())
            producer.stdin.flush()
            i = due
        time.sleep(max(0.0, min(0.005, t0 + i / rate - time.monotonic())))
    produced_s = time.monotonic() - t0
    producer.stdin.close()
    try:
        producer.wait(timeout=60)
    except subprocess.TimeoutExpired:
        producer.kill()
        raise Failure("kafka_test_tool produce did not finish")
    if producer.returncode != 0:
        raise Failure("kafka_test_tool produce: %s" % producer.stderr.read().decode()[-500:])
    t_end = wait_settled(s, watch, n, 120)
    rec = finish(s, watch, [w], n, win, t_start, t_end, latency_ms=latency_ms,
                 max_in_flight=BIG_IN_FLIGHT, offered_rate=rate, produced_seconds=produced_s)
    metrics = s.admin_metrics(w)
    # Produce time as the broker stored it (the producer's CreateTime), per attempt.
    created, types = {}, set()
    for line in s.tool("dump", s.topics["commands"]).splitlines():
        if line.strip():
            m = json.loads(line)
            types.add(m.get("timestamp_type"))
            created[json.loads(m["value"])["payment_attempt_id"]] = m["timestamp"] / 1000.0
    if types != {"create"}:
        raise Failure("the commands' timestamps are %s, not the producer's CreateTime" % types)
    # Persisted: the transition into the attempt's final status (its created_at is the
    # persisting statement's clock_timestamp(), as updated_at), else updated_at.
    done = {}
    for aid, t in watch.run(
            "SELECT p.id, extract(epoch FROM coalesce(max(t.created_at), p.updated_at))"
            " FROM payment_attempts p LEFT JOIN attempt_transitions t"
            " ON t.payment_attempt_id = p.id AND t.new_status = p.status"
            " WHERE p.status NOT IN ('PENDING', 'PROCESSING') GROUP BY p.id, p.updated_at"):
        done[aid] = float(t)
    # Where the time goes, per attempt: Kafka -> its row recorded (created_at, the
    # recording statement's now()), -> its first provider call sent (provider_calls'
    # started_at), -> answered (+ latency_ms), -> its outcome persisted.
    stages = {"to_recorded": [], "to_sent": [], "call": [], "to_persisted": []}
    for aid, rec_t, sent, call_ms in watch.run(
            "SELECT p.id, extract(epoch FROM p.created_at), extract(epoch FROM min(c.started_at)),"
            " (array_agg(c.latency_ms ORDER BY c.started_at))[1]"
            " FROM payment_attempts p JOIN provider_calls c ON c.payment_attempt_id = p.id"
            " GROUP BY p.id, p.created_at"):
        if aid in created and aid in done and call_ms:
            rec_t, sent, call_ms = float(rec_t), float(sent), float(call_ms)
            stages["to_recorded"].append((rec_t - created[aid]) * 1000.0)
            stages["to_sent"].append((sent - rec_t) * 1000.0)
            stages["call"].append(call_ms)
            stages["to_persisted"].append((done[aid] - sent) * 1000.0 - call_ms)
    watch.close()
    lat = sorted((done[a] - created[a]) * 1000.0 for a in done if a in created)
    if len(lat) != n:
        raise Failure("latency: %d of %d attempts have both times" % (len(lat), n))

    def pct(p):
        return lat[min(len(lat) - 1, int(round(p / 100.0 * (len(lat) - 1))))]
    rec["latency_ms"] = latency_ms
    rec["e2e_ms"] = {"p50": pct(50), "p95": pct(95), "p99": pct(99), "max": lat[-1],
                     "mean": statistics.mean(lat), "min": lat[0]}
    rec["stages_ms"] = {}
    for k, v in stages.items():
        v.sort()
        if v:
            rec["stages_ms"][k] = {"p50": v[len(v) // 2], "p99": v[min(len(v) - 1, int(
                round(0.99 * (len(v) - 1))))], "mean": statistics.mean(v), "n": len(v)}
    rec["in_flight_at_end"] = metrics.get("charged_provider_calls_in_flight")
    rec["statuses"] = s.check_invariants()
    ctx.done(s)
    log("latency at %.0f/s, provider %d ms: p50 %.0f ms, p95 %.0f ms, p99 %.0f ms" % (
        rate, latency_ms, pct(50), pct(95), pct(99)))
    return rec


def part_rss(ctx, count):
    # Long enough that every call is claimed and sent before the first answers.
    latency = max(3000, 2 * count)
    s = ctx.scenario("rss_%d" % count, psp_args=[
        "--latency-ms", str(latency), "--max-connections", str(count + 1000)])
    s.publish([e2e.new_command() for _ in range(count)])
    watch = e2e.Session(url_as(s.db, "postgres", s.tag.lower()))
    win = Window(ctx, s.psp.pid)
    win.start()
    port = e2e.free_port()
    t_start = time.time()
    w = s.start_worker(WORKER_MAX_IN_FLIGHT=count, LOG_LEVEL="warn",
                       ADMIN_ADDR="127.0.0.1:%d" % port, PROVIDER_TIMEOUT_MS=latency + 10000,
                       WORKER_LEASE_MS=6 * (latency + 10000))  # outlasts the retries
    s.admin_ports[w] = port
    pid = s.workers[w].pid
    peak = {"in_flight": 0, "rss_kib": 0}

    def sample():
        try:
            g = s.admin_metrics(w).get("charged_provider_calls_in_flight", 0)
        except (OSError, e2e.Failure):
            return  # not listening yet
        if g >= peak["in_flight"]:
            peak.update(in_flight=g, rss_kib=proc_kib(pid, "VmRSS") or 0)
    t_end = wait_settled(s, watch, count, max(120, latency / 1000.0 * 6), each=sample)
    rec = finish(s, watch, [w], count, win, t_start, t_end, latency_ms=latency,
                 max_in_flight=count, in_flight_peak=peak["in_flight"],
                 rss_at_peak_kib=peak["rss_kib"])
    watch.close()
    rec["statuses"] = s.check_invariants()
    ctx.done(s)
    log("rss: %d in flight (gauge peak %d): VmHWM %.1f MiB, VmRSS at the peak %.1f MiB" % (
        count, peak["in_flight"], hwm_mib(rec), peak["rss_kib"] / 1024.0))
    return rec


def part_breaker(ctx, label, n, breaker_env):
    s = ctx.scenario(label, psp_args=FAULTS)
    s.publish([e2e.new_command() for _ in range(n)])
    watch = e2e.Session(url_as(s.db, "postgres", s.tag.lower()))
    win = Window(ctx, s.psp.pid)
    win.start()
    port = e2e.free_port()
    t_start = time.time()
    w = s.start_worker(LOG_LEVEL="warn", ADMIN_ADDR="127.0.0.1:%d" % port, **breaker_env)
    s.admin_ports[w] = port
    t_end = wait_settled(s, watch, n, max(600, n / 5))
    opens = s.admin_metrics(w).get("charged_provider_breaker_opens_total", 0)
    rec = finish(s, watch, [w], n, win, t_start, t_end, breaker=breaker_env or "default",
                 breaker_opens=opens, max_in_flight=1000)  # the default
    watch.close()
    rec["statuses"] = s.check_invariants()
    ctx.done(s)
    log("%s: %d charges in %.2f s: %.0f/s, breaker opened %d times" % (
        label, n, rec["seconds"], rec["rate"], opens))
    return rec


# ---- the report ----

def goals(res):
    """[(what, ratio text, value, goal text, PASS/MISS/n/a)]."""
    out = []
    runs = res.get("charged", {})
    pg = res.get("pgbench")

    def add(what, num, den, goal, ok, fmt="%.2f"):
        if num is None or den is None:
            out.append((what, "n/a", None, goal, "n/a"))
        else:
            v = num / den
            out.append((what, fmt % v, v, goal, "info" if ok is None else
                        "PASS" if ok(v) else "MISS"))
    r0 = runs.get("0ms_1w", {}).get("rate")
    add("0 ms, 1 worker rate / pgbench -N TPS", r0, pg and pg["tps"], ">= 1.0",
        lambda v: v >= 1.0)
    for w in (1, 2):
        a, b = runs.get("100ms_%dw" % w, {}).get("rate"), runs.get("0ms_%dw" % w, {}).get("rate")
        add("100 ms rate / 0 ms rate, %d worker%s" % (w, "s" if w > 1 else ""), a, b, ">= 0.95",
            lambda v: v >= 0.95)
    for key, at in (("latency", "half load"), ("latency_250", "250/s")):
        lat = res.get(key)
        add("latency p99 at %s / (provider 100 ms + 50 ms)" % at,
            lat and lat["e2e_ms"]["p99"], lat and (lat["latency_ms"] + 50), "<= 1.0",
            lambda v: v <= 1.0)
    bl = res.get("baseline")
    add("worker CPU per 1,000, 0 ms 1 worker / %s's" % (
        bl["baseline_commit"] if bl else BASELINE_COMMIT),
        runs.get("0ms_1w", {}).get("cpu_s_per_1000", {}).get("worker"),
        bl and bl["cpu_s_per_1000"]["worker"], "<= 0.5", lambda v: v <= 0.5)
    rss = res.get("rss", {}).get("5000")
    add("peak RSS at 5,000 in flight / 64 MiB", rss and rss["worker_peak_rss_kib"] * 1024.0,
        rss and 64.0 * MIB, "<= 1.0", lambda v: v <= 1.0)
    br = res.get("breaker", {})
    add("breaker default rate / breaker off rate, 20% 5xx", br.get("default", {}).get("rate"),
        br.get("off", {}).get("rate"), ">= 0.8", lambda v: v >= 0.8)
    nv = res.get("naive")
    add("naive consumer rate / pgbench -N TPS", nv and nv["rate"], pg and pg["tps"], "-", None)
    add("charged 0 ms, 1 worker rate / naive consumer rate", r0, nv and nv["rate"], "-", None)
    return out


def print_table(res):
    lines = []
    hdr = "%-24s %9s %6s | %6s %6s %6s %6s %6s | %7s | %6s %6s %7s" % (
        "run", "charges/s", "n", "worker", "pg", "kafka", "psp", "other", "RSS MiB", "stmts",
        "WAL B", "pss WAL")
    lines.append("CPU s per 1,000 charges by process (other: the rest of the machine, this bench"
                 " included); statements and WAL bytes per charge")
    lines.append(hdr)
    lines.append("-" * len(hdr))
    for label, r in all_runs(res):
        c = r["cpu_s_per_1000"]
        st = r.get("statements")
        lines.append("%-24s %9.0f %6d | %6.2f %6.2f %6.2f %6.2f %6.2f | %7s | %6s %6.0f %7s" % (
            label, r["rate"], r["n"], c.get("worker", c.get("naive", 0)), c["postgres"],
            c["kafka"], c.get("psp_sim", 0), c["other"], "%.1f" % (
                r["worker_peak_rss_kib"] / 1024.0) if "worker_peak_rss_kib" in r else "-",
            "%.3f" % st["per_charge"] if st else "-", r["wal_bytes_per_charge"],
            "%.0f" % st["wal_bytes_per_charge"] if st else "-"))
    pg = res.get("pgbench")
    if pg:
        c = pg["cpu_s_per_1000"]
        lines.append("%-24s %9.0f %6d | %6.2f %6.2f %6.2f %6s %6.2f | %7s | %6s %6.0f %7s" % (
            "pgbench -N (TPS; client)", pg["tps"], pg["transactions"], c["pgbench"],
            c["postgres"], c["kafka"], "-", c["other"], "-", "%.1f" % pg["statements"]["per_charge"] if pg.get("statements") else "-",
            pg["wal_bytes_per_charge"], "%.0f" % pg["statements"]["wal_bytes_per_charge"]
            if pg.get("statements") else "-"))
    return lines


def all_runs(res):
    out = []
    if res.get("naive"):
        out.append(("naive consumer", res["naive"]))
    for k, r in res.get("charged", {}).items():
        out.append(("charged " + k.replace("_", " "), r))
    if res.get("baseline"):
        out.append(("%s 0ms 1w" % res["baseline"]["baseline_commit"], res["baseline"]))
    for k, r in res.get("walcomp", {}).items():
        out.append(("0ms 1w prefill wal %s" % k, r))
    for key in ("latency", "latency_250"):
        if res.get(key):
            out.append(("latency %.0f/s 100ms" % res[key]["offered_rate"], res[key]))
    for k, r in res.get("rss", {}).items():
        out.append(("rss %s in flight" % k, r))
    for k, r in res.get("breaker", {}).items():
        out.append(("breaker %s 20%% 5xx" % k, r))
    return out


def short(name):
    for long_, abbr in (("payment_attempts", "attempts"), ("attempt_transitions", "transitions"),
                        ("ledger_entries", "ledger"), ("INSERT ", "INS "), ("UPDATE ", "UPD ")):
        name = name.replace(long_, abbr)
    return name


def chart(res, path):
    rows = []
    if res.get("pgbench"):
        rows.append(("PGBENCH -N TPS (8 CLIENTS)", res["pgbench"]["tps"],
                     "%.0f TPS" % res["pgbench"]["tps"], 7))
    for label, r in all_runs(res):
        if label.startswith("rss"):
            continue
        rows.append((label, r["rate"], "%.0f/S" % r["rate"], 0 if "charged" in label else 1))
    panels = [png_chart.Panel("CHARGES PER SECOND (AND PGBENCH TPS), ONE RUN", rows)]
    base = res.get("charged", {}).get("0ms_1w")
    if base and base.get("statements"):
        st = [(short(t["name"])[:52], t["share"] * 100, "%.0f%%" % (t["share"] * 100))
              for t in base["statements"]["top"][:6]]
        panels.append(png_chart.Panel("SHARE OF STATEMENT TIME, 0 MS 1 WORKER", st, 100))
    rss = [("%s IN FLIGHT" % k, r["worker_peak_rss_kib"] / 1024.0,
            "%.1f MIB" % (r["worker_peak_rss_kib"] / 1024.0)) for k, r in res.get("rss", {}).items()]
    if rss:
        panels.append(png_chart.Panel("WORKER PEAK RSS (VMHWM)", rss))
    png_chart.write(path, panels, title="CHARGED THROUGHPUT %s %s, %d CORES" % (
        res["date"][:10], res["commit"][:10], res["cores"]))


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="small runs: a smoke test, ~2 min")
    ap.add_argument("--n", type=int, help="commands per charged run [10000; quick 1500]")
    ap.add_argument("--naive-n", type=int, help="commands of the naive run [2000; quick 300]")
    ap.add_argument("--breaker-n", type=int, help="commands per breaker run [6000; quick 600]")
    ap.add_argument("--pgbench-seconds", type=int, help="pgbench -T [15; quick 5]")
    ap.add_argument("--pgbench-scale", type=int, default=4)
    ap.add_argument("--latency-seconds", type=float, help="steady publishing [18; quick 6]")
    ap.add_argument("--latency-rate", type=float,
                    help="commands/s of the latency run [half the 1-worker 100 ms rate]")
    ap.add_argument("--prefill", type=int,
                    help="attempts in the table before the walcomp runs [200000; quick 20000]")
    ap.add_argument("--rss-counts", help="in-flight counts [64,500,1000,5000; quick 64,5000]")
    ap.add_argument("--baseline-commit", default=BASELINE_COMMIT,
                    help="the worker the CPU goal compares with, built from this commit "
                         "[%s]" % BASELINE_COMMIT)
    ap.add_argument("--skip", default="", help="parts to skip: " + ",".join(PARTS))
    ap.add_argument("--only", default="", help="run only these parts")
    ap.add_argument("--keep-databases", action="store_true",
                    help="keep each run's database (dropped after its run by default)")
    ap.add_argument("--out", default=os.path.join(e2e.BUILD, "bench", "throughput.json"))
    ap.add_argument("--chart", help="PNG path [--out with .png]")
    a = ap.parse_args()
    q = a.quick
    n = a.n or (1500 if q else 10000)
    naive_n = a.naive_n or (300 if q else 2000)
    breaker_n = a.breaker_n or (600 if q else 6000)
    pgs = a.pgbench_seconds or (5 if q else 15)
    prefill = a.prefill or (20000 if q else 200000)
    lat_s = a.latency_seconds or (6 if q else 18)
    counts = [int(c) for c in (a.rss_counts or ("64,5000" if q else "64,500,1000,5000")).split(",")]
    parts = [p for p in PARTS if p not in a.skip.split(",")]
    if a.only:
        parts = [p for p in parts if p in a.only.split(",")]
    bad = [p for p in (a.skip + "," + a.only).split(",") if p and p not in PARTS]
    if bad:
        ap.error("unknown part %s (have %s)" % (bad, ",".join(PARTS)))
    chart_path = a.chart or os.path.splitext(a.out)[0] + ".png"
    os.makedirs(os.path.dirname(os.path.abspath(a.out)), exist_ok=True)

    commit = subprocess.run(["git", "-C", REPO, "rev-parse", "HEAD"], capture_output=True,
                            timeout=30).stdout.decode().strip()
    dirty = subprocess.run(["git", "-C", REPO, "status", "--porcelain", "--untracked-files=no"],
                           capture_output=True, timeout=30).stdout.decode().strip() != ""
    res = {"commit": commit, "dirty": dirty, "date": datetime.datetime.now(
        datetime.timezone.utc).isoformat(timespec="seconds"), "cores": os.cpu_count(),
        "machine": platform.platform(), "quick": q, "parts": parts,
        "settings": {"n": n, "naive_n": naive_n, "breaker_n": breaker_n, "pgbench_seconds": pgs,
                     "pgbench_scale": a.pgbench_scale, "latency_seconds": lat_s, "prefill": prefill,
                     "rss_counts": counts, "max_in_flight": BIG_IN_FLIGHT}}
    t_begin = time.monotonic()
    ctx = Ctx(a)
    res["postgres"] = {"version": ctx.pg.version, "pg_stat_statements": ctx.pg.pss,
                       "postmaster_pid": ctx.pg.postmaster}
    for k in ("synchronous_commit", "wal_compression", "shared_buffers", "max_wal_size",
              "checkpoint_timeout", "fsync", "full_page_writes"):
        res["postgres"][k] = ctx.pg.one("SHOW %s" % k)
    rc = 0
    try:
        if "pgbench" in parts:
            res["pgbench"] = part_pgbench(ctx, pgs, a.pgbench_scale)
        if "naive" in parts:
            res["naive"] = part_naive(ctx, naive_n)
        if "charged" in parts:
            res["charged"] = {}
            for lat in (0, 100):
                for w in (1, 2):
                    res["charged"]["%dms_%dw" % (lat, w)] = charged_run(
                        ctx, "%dms_%dw" % (lat, w), n, lat, workers=w)
        if "baseline" in parts:
            res["baseline"] = baseline_run(ctx, a.baseline_commit, n)
        if "walcomp" in parts:
            res["walcomp"] = {}
            for comp in ("off", "lz4"):
                try:
                    ctx.pg.set_wal_compression(comp)
                    # 5,000 in flight over a table in service: the lease and persist
                    # statements at the size that once made their plans quadratic.
                    r = charged_run(ctx, "0ms_1w_prefill_%s" % comp, n, 0, prefill=prefill,
                                    in_flight=5000)
                    r.update(wal_compression=comp, prefill=prefill)
                    res["walcomp"][comp] = r
                finally:
                    ctx.pg.set_wal_compression(None)
        if "latency" in parts:
            base = res.get("charged", {}).get("100ms_1w")
            rate = a.latency_rate or (base["rate"] / 2 if base else 200.0)
            res["latency"] = part_latency(ctx, rate, lat_s)
            res["latency"]["rate_from"] = ("--latency-rate" if a.latency_rate else
                                           "half the 1-worker 100 ms rate" if base else
                                           "default 200/s (the charged part was skipped)")
            res["latency_250"] = part_latency(ctx, 250.0, lat_s)
        if "rss" in parts:
            res["rss"] = {str(c): part_rss(ctx, c) for c in counts}
        if "breaker" in parts:
            res["breaker"] = {
                "off": part_breaker(ctx, "breaker_off", breaker_n,
                                    {"PROVIDER_BREAKER_FAILURE_RATE": "0"}),
                "default": part_breaker(ctx, "breaker_default", breaker_n, {})}
    except Exception:
        import traceback
        traceback.print_exc()
        for s in ctx.open:
            print("logs of %s are in %s" % (s.name, s.dir), file=sys.stderr)
        rc = 1
    finally:
        for s in list(ctx.open):
            ctx.done(s)
        ctx.pg.close()
    res["elapsed_s"] = time.monotonic() - t_begin
    res["goals"] = [{"what": g[0], "ratio": g[2], "goal": g[3], "verdict": g[4]}
                    for g in goals(res)]
    with open(a.out, "w") as f:
        json.dump(res, f, indent=1, sort_keys=True)
    chart(res, chart_path)

    print()
    print("charged throughput bench: commit %s%s, %s, %d cores, %.0f s%s" % (
        commit[:12], " (uncommitted changes)" if dirty else "", res["date"], res["cores"],
        res["elapsed_s"], ", QUICK" if q else ""))
    if not ctx.pg.pss:
        print("(no statement statistics: PostgreSQL runs without pg_stat_statements; "
              "deploy/stack.sh down && deploy/stack.sh up)")
    for line in print_table(res):
        print(line)
    lat = res.get("latency")
    if lat:
        e = lat["e2e_ms"]
        print("latency at %.0f/s, provider 100 ms: p50 %.0f ms, p95 %.0f ms, p99 %.0f ms, max "
              "%.0f ms (Kafka CreateTime -> outcome persisted)" % (
                  lat["offered_rate"], e["p50"], e["p95"], e["p99"], e["max"]))
        print("  by stage (p50 / p99 ms): " + ", ".join(
            "%s %.0f / %.0f" % (k.replace("_", " "), v["p50"], v["p99"])
            for k, v in lat["stages_ms"].items()))
    base = res.get("charged", {}).get("0ms_1w")
    if base and base.get("statements"):
        print("top statements, 0 ms 1 worker (%.3f statements, %.2f ms of statement time per "
              "charge):" % (base["statements"]["per_charge"], base["statements"]["db_ms_per_charge"]))
        for t in base["statements"]["top"][:6]:
            print("  %5.1f%%  calls %6d  rows %6d  mean %6.3f ms  WAL %9d B  %s" % (
                t["share"] * 100, t["calls"], t["rows"], t["mean_ms"], t["wal_bytes"],
                t["name"][:70]))
    print("goals:")
    for what, ratio, _, goal, verdict in goals(res):
        print("  %-52s %6s  goal %-7s %s" % (what, ratio, goal, verdict))
    print("wrote %s and %s" % (a.out, chart_path))
    return rc


if __name__ == "__main__":
    sys.exit(main())
