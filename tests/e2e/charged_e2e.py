"""End-to-end harness: real Kafka, real PostgreSQL, real psp-sim, real workers.

Each scenario gets its own database, topics, consumer group and psp-sim, so
scenarios never see each other's data. Correctness is judged by invariants
over what psp-sim actually charged (its ledger), not by what workers believe.
Python standard library only.
"""

import json
import os
import random
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
import uuid

BUILD = os.environ.get("CHARGED_BUILD_DIR", "build")
CHARGED = os.path.join(BUILD, "worker", "charged")
CHARGECTL = os.path.join(BUILD, "worker", "chargectl", "chargectl")
PSP_SIM = os.path.join(BUILD, "tools", "psp-sim", "psp-sim")
# CHARGED_KAFKA_TOOL: another kafka_test_tool than the build's (say, a newer
# one, to run new scenarios against an older build).
# The consumer group protocol the scenarios' workers use: "classic"
# (cooperative-sticky, the default) or "consumer" (KIP-848).
GROUP_PROTOCOL = os.environ.get("CHARGED_TEST_GROUP_PROTOCOL", "classic")
if GROUP_PROTOCOL not in ("classic", "consumer"):
    raise SystemExit("CHARGED_TEST_GROUP_PROTOCOL=%r: want classic or consumer" % GROUP_PROTOCOL)
KAFKA_TOOL = os.environ.get("CHARGED_KAFKA_TOOL") or os.path.join(BUILD, "tests", "kafka_test_tool")
API_KEY = "sk_test_e2e"
STACK = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "deploy", "stack.sh")


class Failure(Exception):
    pass


def check(cond, message):
    """Failure(message) unless cond. Use it instead of `assert`, which
    python -O removes (tests/e2e/test_no_bare_assert.py keeps it out).
    message may be a function returning the text, when building it is costly
    or only valid once cond is false. Returns cond."""
    if not cond:
        raise Failure(message() if callable(message) else str(message))
    return cond


def check_eq(got, want, what):
    """Failure naming what, with both values, unless got == want."""
    if got != want:
        raise Failure("%s: got %r, want %r" % (what, got, want))
    return got


def _timeout_scale():
    raw = os.environ.get("CHARGED_TEST_TIMEOUT_SCALE", "").strip() or "1"
    try:
        v = float(raw)
    except ValueError:
        v = 0
    if not v > 0:
        raise ValueError("CHARGED_TEST_TIMEOUT_SCALE=%r: want a number > 0" % raw)
    return v


# CHARGED_TEST_TIMEOUT_SCALE (default 1) stretches every deadline the harness
# waits for (wait_until, wait_settled, process waits): tools/run-all-tests.sh
# sets 3 for the ASan+UBSan build, 2-5x slower. A deadline only bounds how
# long a test waits for what it expects; it never decides what passes. Bounds
# that ARE the behaviour under test (wait_worker_exit_or_kill) are not scaled.
TIMEOUT_SCALE = _timeout_scale()


def scaled(seconds):
    """seconds stretched by CHARGED_TEST_TIMEOUT_SCALE."""
    return seconds * TIMEOUT_SCALE


def log(*args):
    print(time.strftime("%H:%M:%S"), *args, flush=True)


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_until(what, cond, timeout, interval=0.2):
    """Polls cond() until it returns a true value or the deadline passes
    (timeout seconds, times CHARGED_TEST_TIMEOUT_SCALE)."""
    limit = scaled(timeout)
    deadline = time.monotonic() + limit
    while True:
        v = cond()
        if v:
            return v
        if time.monotonic() >= deadline:
            raise Failure("timed out after %.1fs waiting for %s%s" % (
                limit, what, "" if TIMEOUT_SCALE == 1 else
                " (%ss x CHARGED_TEST_TIMEOUT_SCALE %g)" % (timeout, TIMEOUT_SCALE)))
        time.sleep(interval)


def _stopped(pid):
    """True when every thread of pid is stopped ('T' in /proc), or it is gone."""
    try:
        tids = os.listdir("/proc/%d/task" % pid)
    except FileNotFoundError:
        return True
    for tid in tids:
        try:
            with open("/proc/%d/task/%s/stat" % (pid, tid)) as f:
                state = f.read().rsplit(")", 1)[1].split()[0]
        except (FileNotFoundError, IndexError):
            continue
        if state not in ("T", "t"):
            return False
    return True


def freeze(pid):
    """SIGSTOP pid and return once every one of its threads has stopped: kill()
    only marks the signal pending, and a thread running on the other core
    goes on until it next leaves the kernel, which on a loaded machine is
    long enough for the step a scenario means to freeze it before."""
    os.kill(pid, signal.SIGSTOP)
    wait_until("pid %d stopped by SIGSTOP" % pid, lambda: _stopped(pid), 10, 0.005)


# ---- the stack itself: faults for the scenarios that take it away ----
#
# deploy/stack.sh runs with the inherited environment (CHARGED_STACK_DIR and
# the ports), so it acts on the stack the tests use; stack_check() refuses to
# act when that stack is not the one CHARGED_TEST_* point at.

def _port(address):
    return int(address.rsplit(":", 1)[1].split("/", 1)[0])


def stack_check():
    pg = int(os.environ.get("CHARGED_PG_PORT", "55432"))
    kafka = int(os.environ.get("CHARGED_KAFKA_PORT", "9092"))
    want_pg = _port(os.environ["CHARGED_TEST_DATABASE_URL"].split("@", 1)[-1])
    want_kafka = _port(os.environ["CHARGED_TEST_KAFKA"].split(",", 1)[0])
    if (pg, kafka) != (want_pg, want_kafka):
        raise Failure("deploy/stack.sh would act on PostgreSQL :%d and Kafka :%d, but the "
                      "tests use :%d and :%d; export CHARGED_STACK_DIR, CHARGED_PG_PORT and "
                      "CHARGED_KAFKA_PORT of the test stack" % (pg, kafka, want_pg, want_kafka))


def stack(*args, timeout=240):
    """deploy/stack.sh ARGS with the inherited environment; Failure unless it exits 0."""
    stack_check()
    t0 = time.monotonic()
    timeout = scaled(timeout)
    try:
        p = subprocess.run([STACK] + list(args), capture_output=True, env=dict(os.environ),
                           stdin=subprocess.DEVNULL, timeout=timeout)
    except subprocess.TimeoutExpired:
        raise Failure("deploy/stack.sh %s did not finish within %.0fs" % (" ".join(args), timeout))
    if p.returncode != 0:
        raise Failure("deploy/stack.sh %s exited %d: %s" % (
            " ".join(args), p.returncode, (p.stdout + p.stderr).decode()[-2000:]))
    log("stack %s (%.1fs)" % (" ".join(args), time.monotonic() - t0))


def kafka_kill():
    """SIGKILL the broker; returns once its process is gone."""
    stack("kafka-kill")


def kafka_start():
    """Starts the broker again; returns once it answers metadata requests."""
    stack("kafka-start")


def pg_stop_immediate():
    """pg_ctl -m immediate stop: PostgreSQL goes away as if it crashed."""
    stack("pg-stop-immediate")


def pg_start():
    """Starts PostgreSQL again (crash recovery included); returns once it accepts."""
    stack("pg-start")


def pg_freeze():
    """SIGSTOP on the postmaster and every process it started: connections
    stay open and the kernel acknowledges what clients send, but nothing
    answers (a hung host). Nothing of the scenario may query the database
    until pg_thaw()."""
    stack("pg-freeze")


def pg_thaw():
    """SIGCONT on PostgreSQL's processes: they go on where they stopped."""
    stack("pg-thaw")


def stack_restore():
    """Whatever a scenario did to the stack, brings both back (for finally
    blocks); a frozen PostgreSQL is thawed (pg-start does that first)."""
    for start in (pg_start, kafka_start):
        try:
            start()
        except Exception as e:  # report, and still try the other one
            log("could not restore the stack:", e)


def parse_metrics(text):
    """Prometheus text format -> {series: value}; comment lines skipped."""
    series = {}
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        name, _, value = line.rpartition(" ")
        series[name] = float(value)
    return series


def new_command(order_id=None, amount=None, payment_method="pm_card_visa", **extra):
    attempt = str(uuid.uuid4())
    cmd = {
        "type": "charge.requested",
        "version": 1,
        "payment_attempt_id": attempt,
        "order_id": order_id or str(uuid.uuid4()),
        "idempotency_key": "attempt:" + attempt,
        "amount": amount if amount is not None else random.randint(100, 100000),
        "currency": "EUR",
        "payment_method": payment_method,
    }
    cmd.update(extra)
    return cmd


def new_refund(charge, amount, reason="requested_by_customer", **extra):
    """A refund.requested command for the charge command `charge`."""
    refund = str(uuid.uuid4())
    cmd = {
        "type": "refund.requested",
        "version": 1,
        "refund_id": refund,
        "payment_attempt_id": charge["payment_attempt_id"],
        "idempotency_key": "refund:" + refund,
        "amount": amount,
        "reason": reason,
    }
    cmd.update(extra)
    return cmd


class Scenario:
    """One isolated world: database, topics, group, psp-sim and workers."""

    def __init__(self, name, partitions=12, psp_args=(), worker_env=None):
        self.name = name
        self.tag = "%s_%d_%s" % (name, os.getpid(), uuid.uuid4().hex[:6])
        self.dir = os.path.join(BUILD, "e2e-logs", self.tag)
        os.makedirs(self.dir, exist_ok=True)
        base_db = os.environ["CHARGED_TEST_DATABASE_URL"]
        self.kafka = os.environ["CHARGED_TEST_KAFKA"]
        self.db = base_db.rsplit("/", 1)[0] + "/" + self.tag.lower()
        self.admin_db = base_db
        self.topics = {
            "commands": "e2e.%s.commands" % self.tag,
            "results": "e2e.%s.results" % self.tag,
            "dlq": "e2e.%s.dlq" % self.tag,
        }
        self.group = "e2e-" + self.tag
        self.workers = {}
        self.reconcilers = {}  # name -> Popen of `charged reconciler` (start_reconciler)
        self.apis = {}  # name -> Popen of `charged api` (charged_api.start_api)
        self.relays = {}  # name -> Popen of `charged relay` (start_relay)
        self.auditors = {}  # name -> Popen of `charged auditor` (start_auditor)
        self.admin_ports = {}  # name -> port of its admin listener (admin_port)
        self.worker_ids = {}  # name -> WORKER_ID (lease_owner, actor in the tables)
        self.worker_seq = 0
        self.published_keys = set()  # idempotency keys of the commands published
        self.worker_env = dict(worker_env or {})
        self.psp = None
        self.psp_args = list(psp_args)
        self.psp_ledger_before = []  # charges of psp-sims killed by psp_kill()
        self.psp_port_hold = None  # the API port while psp-sim is down (psp_kill)

        self.created_at = time.time()  # check_audited audits from here
        self.psql(self.admin_db, 'CREATE DATABASE "%s"' % self.tag.lower())
        self.tool("create-topic", self.topics["commands"], str(partitions))
        self.tool("create-topic", self.topics["results"], "3")
        self.tool("create-topic", self.topics["dlq"], "3")
        self.run([CHARGECTL, "migrate"])
        self.start_psp()

    # ---- processes ----

    def env(self, extra=None):
        e = dict(os.environ)
        e.update({
            "DATABASE_URL": self.db,
            "KAFKA_BOOTSTRAP_SERVERS": self.kafka,
            "KAFKA_GROUP_ID": self.group,
            "CHARGE_COMMANDS_TOPIC": self.topics["commands"],
            "CHARGE_RESULTS_TOPIC": self.topics["results"],
            "CHARGE_DLQ_TOPIC": self.topics["dlq"],
            "PROVIDER_API_KEY": API_KEY,
            "PROVIDER_BASE_URL": "http://127.0.0.1:%d" % self.psp_port if self.psp else "",
            "PROVIDER_TIMEOUT_MS": "2000",
            "WORKER_LEASE_MS": "12000",
            "WORKER_UNKNOWN_RETRIES": "3",
            "WORKER_RETRY_BASE_MS": "50",
            "WORKER_RETRY_MAX_MS": "500",
            "WORKER_RECHECK_MS": "200",
            "WORKER_COMMIT_INTERVAL_MS": "200",
            "KAFKA_SESSION_TIMEOUT_MS": "6000",
            "KAFKA_HEARTBEAT_INTERVAL_MS": "1000",
            "LOG_LEVEL": "info",
            # Many daemons run side by side: each admin listener takes a port
            # the kernel picks and names it in its log (admin_port()).
            "ADMIN_ADDR": "127.0.0.1:0",
        })
        e.pop("CHARGED_FAILPOINT", None)
        if GROUP_PROTOCOL == "consumer":
            # KIP-848: the broker owns the session and heartbeat timing
            # (deploy/stack.sh sets them short), the client may not.
            e["KAFKA_GROUP_PROTOCOL"] = "consumer"
            e.pop("KAFKA_SESSION_TIMEOUT_MS")
            e.pop("KAFKA_HEARTBEAT_INTERVAL_MS")
        e.update(self.worker_env)
        e.update(extra or {})
        return e

    def run(self, argv, stdin=None, check=True, extra_env=None):
        p = subprocess.run(argv, input=stdin, capture_output=True, env=self.env(extra_env))
        if check and p.returncode != 0:
            raise Failure("%s exited %d: %s" % (argv[:3], p.returncode, p.stderr.decode()[-2000:]))
        return p

    def set_limits(self, *args, actor="e2e"):
        """The fleet's provider budget, set at run time as an operator does:
        `chargectl provider limits set --actor ACTOR ARGS` (say "--global",
        "100", "--class", "list=10"); fails the scenario if it is refused."""
        self.run([CHARGECTL, "provider", "limits", "set", "--actor", actor] + list(args))

    def psp_window(self, t0, t1):
        """(served, throttled): psp-sim's requests in the seconds t0 <= at < t1
        (epoch seconds), from its limiter's per-second series."""
        series = self.psp_get("/rate-limits")["per_second"]
        return (sum(q["served"] for q in series if t0 <= q["at"] < t1),
                sum(q["throttled"] for q in series if t0 <= q["at"] < t1))

    def tool(self, *args, stdin=None, extra_env=None):
        return self.run([KAFKA_TOOL] + list(args), stdin=stdin,
                        extra_env=extra_env).stdout.decode()

    def start_psp(self, port=0):
        """psp-sim on ports the kernel picks (--port 0): it names them in its
        first stdout line once it listens, so no other process can take them
        in between. A thread copies its stdout (that line included) to
        psp-sim.log, where its logs (stderr) go too. port: the API port to
        listen on instead (psp_restart)."""
        import queue
        import re
        import threading
        out = open(os.path.join(self.dir, "psp-sim.log"), "ab")
        self.psp = subprocess.Popen(
            [PSP_SIM, "--port", str(port), "--admin-port", "0", "--api-key", API_KEY]
            + self.psp_args, stdout=subprocess.PIPE, stderr=out)
        first = queue.Queue()

        def drain(pipe):
            first_line = True
            for line in iter(pipe.readline, b""):
                out.write(line)
                out.flush()
                if first_line:
                    first.put(line)
                    first_line = False
            if first_line:
                first.put(b"")  # exited without a word
        threading.Thread(target=drain, args=(self.psp.stdout,), daemon=True).start()
        limit = scaled(10)
        try:
            line = first.get(timeout=limit)
        except queue.Empty:
            line = None
        m = re.match(rb"psp-sim listening port=(\d+) admin_port=(\d+)\n\Z", line or b"")
        if not m:
            self.psp.kill()
            rc = self.psp.wait(timeout=scaled(30))
            self.psp = None
            raise Failure("psp-sim did not print its ports (first line %r, exit %s, "
                          "waited up to %.0fs); see %s" % (line, rc, limit, out.name))
        self.psp_port, self.psp_admin = int(m.group(1)), int(m.group(2))
        wait_until("psp-sim", lambda: self._psp_up(), 10)

    def psp_freeze(self):
        """SIGSTOP psp-sim: it keeps its port and the kernel still accepts
        connections, but nothing is answered (calls time out after sending).
        Its admin API is frozen too. psp_thaw() lets it go on, with what it
        had received meanwhile."""
        freeze(self.psp.pid)
        log("psp-sim frozen (SIGSTOP)")

    def psp_thaw(self):
        self.psp.send_signal(signal.SIGCONT)
        log("psp-sim thawed (SIGCONT)")

    def psp_kill(self):
        """psp-sim goes away (SIGKILL): connections to its API port are
        refused until psp_restart() starts a new one on the same port. The
        port is held meanwhile by a socket bound to it that does not listen
        (the kernel refuses connections to it, and gives the port to no one
        else). Its ledger dies with it: what it charged is read first and
        kept, and ledger() returns it with the new one's. Call it when no
        call is in flight, or a charge made between that read and the kill
        would be missed."""
        before = self.psp_get("/ledger")["charges"]
        self.psp.kill()
        self.psp.wait(timeout=scaled(30))
        hold = socket.socket()
        hold.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        hold.bind(("127.0.0.1", self.psp_port))
        self.psp_port_hold = hold
        self.psp_ledger_before.extend(before)
        log("psp-sim killed; port", self.psp_port, "refuses connections")

    def psp_restart(self):
        """A new psp-sim on the API port of the one psp_kill() killed (it
        knows none of the old one's keys or intents)."""
        port = self.psp_port
        self.psp_port_hold.close()
        self.psp_port_hold = None
        self.start_psp(port=port)
        check_eq(self.psp_port, port, "psp-sim's port after a restart")
        log("psp-sim restarted on port", port)

    def _psp_up(self):
        try:
            return self.psp_get("/health").get("ok")
        except OSError:
            return False

    def psp_get(self, path):
        with urllib.request.urlopen("http://127.0.0.1:%d%s" % (self.psp_admin, path), timeout=30) as r:
            return json.load(r)

    def psp_put(self, path, body, method="PUT"):
        req = urllib.request.Request("http://127.0.0.1:%d%s" % (self.psp_admin, path),
                                     data=json.dumps(body).encode(), method=method)
        with urllib.request.urlopen(req, timeout=30) as r:
            return json.load(r)

    def start_worker(self, **extra_env):
        self.worker_seq += 1
        name = "w%d" % self.worker_seq
        out = open(os.path.join(self.dir, name + ".log"), "ab")
        env = self.env({"WORKER_ID": "%s-%s" % (name, uuid.uuid4().hex[:6])})
        env.update({k: str(v) for k, v in extra_env.items()})
        p = subprocess.Popen([CHARGED, "worker"], stdout=out, stderr=out, env=env)
        self.workers[name] = p
        self.worker_ids[name] = env["WORKER_ID"]
        log("started worker", name, "pid", p.pid)
        return name

    def start_reconciler(self, **extra_env):
        """`charged reconciler` with the scenario's environment plus extra_env;
        its log is <name>.log in the scenario dir, its WORKER_ID (lease_owner,
        actor of its transitions and provider calls) in worker_ids[name]."""
        self.worker_seq += 1
        name = "r%d" % self.worker_seq
        out = open(os.path.join(self.dir, name + ".log"), "ab")
        env = self.env({"WORKER_ID": "%s-%s" % (name, uuid.uuid4().hex[:6])})
        env.update({k: str(v) for k, v in extra_env.items()})
        p = subprocess.Popen([CHARGED, "reconciler"], stdout=out, stderr=out, env=env)
        self.reconcilers[name] = p
        self.worker_ids[name] = env["WORKER_ID"]
        log("started reconciler", name, "pid", p.pid)
        return name

    def start_relay(self, **extra_env):
        """`charged relay` with the scenario's environment plus extra_env;
        its log is <name>.log in the scenario dir."""
        self.worker_seq += 1
        name = "rl%d" % self.worker_seq
        out = open(os.path.join(self.dir, name + ".log"), "ab")
        env = self.env({"WORKER_ID": "%s-%s" % (name, uuid.uuid4().hex[:6])})
        env.update({k: str(v) for k, v in extra_env.items()})
        p = subprocess.Popen([CHARGED, "relay"], stdout=out, stderr=out, env=env)
        self.relays[name] = p
        self.worker_ids[name] = env["WORKER_ID"]
        log("started relay", name, "pid", p.pid)
        return name

    def start_auditor(self, **extra_env):
        """`charged auditor` with the scenario's environment plus extra_env;
        its log is <name>.log in the scenario dir."""
        self.worker_seq += 1
        name = "au%d" % self.worker_seq
        out = open(os.path.join(self.dir, name + ".log"), "ab")
        env = self.env({"WORKER_ID": "%s-%s" % (name, uuid.uuid4().hex[:6])})
        env.update({k: str(v) for k, v in extra_env.items()})
        p = subprocess.Popen([CHARGED, "auditor"], stdout=out, stderr=out, env=env)
        self.auditors[name] = p
        self.worker_ids[name] = env["WORKER_ID"]
        log("started auditor", name, "pid", p.pid)
        return name

    def stop_auditor(self, name, sig=signal.SIGTERM, timeout=60):
        """Signals an auditor and returns its exit status."""
        p = self.auditors.pop(name)
        p.send_signal(sig)
        return p.wait(timeout=scaled(timeout))

    def audit(self, *args, check=False):
        """`chargectl audit <args>`: (exit status, stdout, stderr)."""
        p = self.run([CHARGECTL, "audit"] + list(args), check=check)
        return p.returncode, p.stdout.decode(), p.stderr.decode()

    def check_audited(self):
        """`chargectl audit run` over the scenario's whole life: no
        finding, every intent and refund psp-sim holds seen, and every
        ledger row. Returns the verdict."""
        since = int(time.time() - self.created_at) + 2
        rc, out, err = self.audit("run", "--since", "%ds" % since, "--json")
        check(rc == 0, "chargectl audit run over the run: exit %d, %s %s"
              % (rc, err.strip()[-500:], out[-3000:]))
        v = json.loads(out)
        psp = self.psp_get("/ledger")
        n_ledger = int(self.query("SELECT count(*) FROM ledger_entries")[0][0])
        check_eq((v["intents_seen"], v["refunds_seen"], v["ledger_rows_seen"]),
                 (psp["counters"]["intents"], psp["counters"]["refund_objects"], n_ledger),
                 "audit: intents, refunds and ledger rows seen")
        log("audit: %d intents, %d refunds, %d ledger rows, no finding"
            % (v["intents_seen"], v["refunds_seen"], v["ledger_rows_seen"]))
        return v

    def audit_totals(self):
        """Sums over the scheduled verdicts: intents, refunds, ledger rows,
        findings, and the watermark (unix s; 0 before the first)."""
        rows = self.query(
            "SELECT count(*), coalesce(sum(intents_seen), 0), coalesce(sum(refunds_seen), 0),"
            " coalesce(sum(ledger_rows_seen), 0),"
            " coalesce(sum((SELECT sum(value::bigint) FROM jsonb_each_text(findings))), 0),"
            " coalesce(extract(epoch FROM max(window_end))::bigint, 0)"
            " FROM audit_windows WHERE scheduled")
        keys = ("windows", "intents", "refunds", "ledger_rows", "findings", "watermark")
        return dict(zip(keys, (int(v) for v in rows[0])))

    def stop_relay(self, name, sig=signal.SIGTERM, timeout=60):
        """Signals a relay and returns its exit status."""
        p = self.relays.pop(name)
        p.send_signal(sig)
        rc = p.wait(timeout=scaled(timeout))
        log("relay", name, "exited", rc)
        return rc

    # ---- the admin listener (ADMIN_ADDR) ----

    def process(self, name):
        """The Popen of a worker, reconciler, relay, api or auditor started here."""
        for group in (self.workers, self.reconcilers, self.relays, self.apis, self.auditors):
            if name in group:
                return group[name]
        raise Failure("no process %s in scenario %s" % (name, self.name))

    def admin_port(self, name, timeout=30):
        """The port of process `name`'s admin listener: with ADMIN_ADDR
        127.0.0.1:0 (the harness's default) the kernel picks it, so no other
        process can take it first, and the daemon names it in its "admin
        listener started" log line (at LOG_LEVEL info or debug)."""
        if name in self.admin_ports:
            return self.admin_ports[name]
        path = os.path.join(self.dir, name + ".log")
        p = self.process(name)

        def found():
            with open(path, "rb") as f:
                for line in f:
                    try:
                        rec = json.loads(line)
                    except ValueError:
                        continue
                    if rec.get("msg") == "admin listener started":
                        return int(rec["port"])
            if p.poll() is not None:
                raise Failure("%s exited %s before its admin listener started; see %s"
                              % (name, p.returncode, path))
            return None
        port = wait_until("the admin listener of %s (its log needs LOG_LEVEL info)" % name,
                          found, timeout)
        self.admin_ports[name] = port
        return port

    def admin_get(self, name, path, timeout=10):
        """GET path on process `name`'s admin listener: (status, body text)."""
        url = "http://127.0.0.1:%d%s" % (self.admin_port(name), path)
        try:
            with urllib.request.urlopen(url, timeout=scaled(timeout)) as r:
                return r.status, r.read().decode()
        except urllib.error.HTTPError as e:
            return e.code, e.read().decode()

    def admin_metrics(self, name):
        """The series of process `name`'s /metrics as {series: value}, the
        series written as exposed: 'charged_ready',
        'charged_messages_total{outcome="settled"}'."""
        status, text = self.admin_get(name, "/metrics")
        check_eq(status, 200, "status of GET /metrics of %s" % name)
        return parse_metrics(text)

    def stop_reconciler(self, name, sig=signal.SIGTERM, timeout=60):
        """Signals a reconciler and returns its exit status."""
        p = self.reconcilers.pop(name)
        p.send_signal(sig)
        rc = p.wait(timeout=scaled(timeout))
        log("reconciler", name, "exited", rc)
        return rc

    def wait_group_settled(self, names, quiet=3, timeout=60):
        """Until every worker in names is ready (it holds partitions) and
        none of them logged a rebalance for `quiet` seconds: a scenario that
        needs its workers to keep what they hold starts from there."""
        import datetime

        def last_rebalance():
            stamps = [l["ts"] for n in names for l in self.worker_log(n, "partitions ")]
            if not stamps:
                return None
            t = datetime.datetime.strptime(max(stamps), "%Y-%m-%dT%H:%M:%S.%fZ")
            return t.replace(tzinfo=datetime.timezone.utc).timestamp()

        def settled():
            if any(self.admin_get(n, "/readyz")[0] != 200 for n in names):
                return False
            last = last_rebalance()
            return last is not None and time.time() - last >= quiet
        wait_until("the group to settle (%s)" % ", ".join(names), settled, timeout)

    def worker_log(self, name, msg=None):
        """The JSON log lines of worker (or reconciler) `name`, as dicts; with
        msg, only those whose "msg" starts with it. Other lines (sanitizer
        output, say) are skipped."""
        lines = []
        with open(os.path.join(self.dir, name + ".log"), "rb") as f:
            for raw in f:
                try:
                    line = json.loads(raw)
                except ValueError:
                    continue
                if isinstance(line, dict) and (msg is None or
                                               str(line.get("msg", "")).startswith(msg)):
                    lines.append(line)
        return lines

    def kill_worker(self, name, sig=signal.SIGKILL):
        p = self.workers[name]
        p.send_signal(sig)
        rc = p.wait(timeout=scaled(120))
        log("worker", name, "exited", rc)
        del self.workers[name]
        return rc

    def exited_workers(self):
        """Workers that exited on their own since the last call, as
        [(name, status)]; they are forgotten (start_worker starts new ones)."""
        gone = []
        for name, p in list(self.workers.items()):
            rc = p.poll()
            if rc is not None:
                del self.workers[name]
                gone.append((name, rc))
        return gone

    def wait_worker_exit(self, name, timeout):
        p = self.workers[name]
        rc = p.wait(timeout=scaled(timeout))
        del self.workers[name]
        return rc

    def wait_worker_exit_or_kill(self, name, timeout):
        """The worker's exit status if it exits within timeout seconds;
        otherwise it is killed with SIGKILL and this raises Failure. The
        timeout is the bound under test: CHARGED_TEST_TIMEOUT_SCALE does not
        stretch it."""
        p = self.workers[name]
        try:
            rc = p.wait(timeout=max(timeout, 0))
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait(timeout=scaled(30))
            del self.workers[name]
            raise Failure("worker %s was still running %.1fs later; killed it with SIGKILL"
                          % (name, timeout))
        del self.workers[name]
        log("worker", name, "exited", rc)
        return rc

    def close(self):
        for name in list(self.workers):
            try:
                self.kill_worker(name, signal.SIGKILL)
            except Exception:
                pass
        for name in list(self.reconcilers):
            try:
                self.stop_reconciler(name, signal.SIGKILL)
            except Exception:
                pass
        for p in self.apis.values():
            p.kill()
            p.wait(timeout=scaled(30))
        for name in list(self.relays):
            try:
                self.stop_relay(name, signal.SIGKILL)
            except Exception:
                pass
        for name in list(self.auditors):
            try:
                self.stop_auditor(name, signal.SIGKILL)
            except Exception:
                pass
        if self.psp:
            self.psp.send_signal(signal.SIGCONT)  # a frozen one cannot end
            self.psp.terminate()
            self.psp.wait(timeout=scaled(30))
        if self.psp_port_hold:
            self.psp_port_hold.close()

    # ---- data ----

    def psql(self, url, sql):
        p = subprocess.run(["psql", "-X", "-q", "-tA", "-v", "ON_ERROR_STOP=1", url, "-c", sql],
                           capture_output=True)
        if p.returncode != 0:
            raise Failure("psql: " + p.stderr.decode())
        return p.stdout.decode()

    def query(self, sql):
        """Rows as lists of strings ('|'-separated by psql)."""
        out = self.psql(self.db, sql).strip()
        return [line.split("|") for line in out.splitlines() if line]

    def publish(self, commands):
        """Publishes valid commands through chargectl publish --file -."""
        data = "".join(json.dumps(c) + "\n" for c in commands).encode()
        self.run([CHARGECTL, "publish", "--file", "-"], stdin=data)
        self.published_keys.update(c["idempotency_key"] for c in commands
                                   if isinstance(c, dict) and "idempotency_key" in c)

    def produce_raw(self, records, compression=None):
        """Records as kafka_test_tool produce takes them, in one producer (so
        records with one key keep their order on one partition);
        compression: lz4, zstd... (see kafka_test_tool)."""
        data = "".join(json.dumps(r) + "\n" for r in records).encode()
        self.tool("produce", self.topics["commands"], stdin=data,
                  extra_env={"KAFKA_TOOL_COMPRESSION": compression} if compression else None)

    def lag(self):
        return json.loads(self.tool("lag", self.group, self.topics["commands"]))

    def dead_letters(self):
        out = self.tool("dump", self.topics["dlq"])
        return [json.loads(l) for l in out.splitlines() if l.strip()]

    def ledger(self):
        """Every charge psp-sim made, those of psp-sims killed by psp_kill() included."""
        return self.psp_ledger_before + self.psp_get("/ledger")["charges"]

    def attempts(self):
        rows = self.query("SELECT id, order_id, idempotency_key, amount, status, "
                          "coalesce(provider_payment_id, ''), coalesce(reason, '') "
                          "FROM payment_attempts")
        return [dict(zip(("id", "order_id", "key", "amount", "status", "ppid", "reason"), r))
                for r in rows]

    # ---- waiting ----

    def wait_settled(self, n_attempts, timeout, each=None):
        """Until n attempts exist, none is PENDING or claimed, and the group has
        committed every offset of the commands topic. each(), if given, runs
        before every check (say, to restart workers that exited)."""
        def done():
            if each:
                each()
            rows = self.query(
                "SELECT count(*), count(*) FILTER (WHERE status = 'PENDING' OR "
                "(status = 'PROCESSING' AND lease_owner IS NOT NULL)) FROM payment_attempts")
            total, open_ = int(rows[0][0]), int(rows[0][1])
            if total < n_attempts or open_ > 0:
                return False
            return self.lag()["lag"] == 0
        last = [0]

        def progress():
            ok = done()
            if not ok and time.monotonic() - last[0] > 10:
                last[0] = time.monotonic()
                rows = self.query("SELECT status, count(*) FROM payment_attempts GROUP BY 1")
                log("waiting:", dict((r[0], int(r[1])) for r in rows), "lag", self.lag()["lag"])
            return ok
        wait_until("attempts settled and offsets committed", progress, timeout, 0.5)

    # ---- invariants ----

    def check_invariants(self):
        """What the provider actually charged, against what we recorded.
        Intents injected through psp-sim's admin API (what the auditor must
        catch) are the provider's state, not charges of ours: left out."""
        ledger = [c for c in self.ledger() if not c.get("injected")]
        attempts = self.attempts()
        by_key = {}
        for c in ledger:
            by_key.setdefault(c["idempotency_key"], []).append(c)
        twice = {k: v for k, v in by_key.items() if len(v) > 1}
        if twice:
            raise Failure("keys charged more than once at the provider: %s" % list(twice)[:5])
        # A charge is an attempt's own when it is under the attempt's key;
        # another client's intent whose metadata names the attempt is not
        # (issue 34): it is foreign, never the attempt's money.
        own_key = {a["key"]: a["id"] for a in attempts}
        succeeded_charges = {c["payment_attempt_id"]: c for c in ledger
                             if c["outcome"] == "succeeded" and
                             own_key.get(c["idempotency_key"]) == c["payment_attempt_id"]}
        # A command of ours charged under its key has an attempt: the worker
        # records and claims before it calls. A charge with none is money
        # taken and lost to the books (a failover that lost the commit).
        lost = [c for c in ledger if c["outcome"] == "succeeded" and
                c["idempotency_key"] in self.published_keys and
                c["idempotency_key"] not in own_key]
        if lost:
            raise Failure("%d charges at the provider under our commands' keys have no "
                          "attempt: %s" % (len(lost), [c["idempotency_key"] for c in lost[:5]]))
        orders = {}
        for a in attempts:
            if a["status"] == "SUCCEEDED":
                c = succeeded_charges.get(a["id"])
                if not c:
                    raise Failure("SUCCEEDED attempt %s has no charge at the provider" % a["id"])
                if int(c["amount"]) != int(a["amount"]) or c["payment_intent_id"] != a["ppid"]:
                    raise Failure("attempt %s does not match its charge %s" % (a, c))
                orders[a["order_id"]] = orders.get(a["order_id"], 0) + 1
            if a["status"] == "FAILED" and a["id"] in succeeded_charges:
                raise Failure("FAILED attempt %s was charged" % a["id"])
        two = [o for o, n in orders.items() if n > 1]
        if two:
            raise Failure("orders with two SUCCEEDED attempts: %s" % two[:5])
        # Every successful charge belongs to a SUCCEEDED (or still unknown) attempt.
        status = {a["id"]: a["status"] for a in attempts}
        for aid, c in succeeded_charges.items():
            if status.get(aid) not in ("SUCCEEDED", "UNKNOWN", "REQUIRES_REVIEW"):
                raise Failure("charge %s of attempt %s is recorded %s" % (
                    c["payment_intent_id"], aid, status.get(aid)))
        # The history and the ledger have no foreign key on the attempt (the
        # statement that writes them proves it): no row of them is an orphan.
        orphans = self.query(
            "SELECT 'transition', count(*) FROM attempt_transitions t WHERE NOT EXISTS"
            " (SELECT 1 FROM payment_attempts p WHERE p.id = t.payment_attempt_id)"
            " UNION ALL SELECT 'ledger', count(*) FROM ledger_entries l WHERE NOT EXISTS"
            " (SELECT 1 FROM payment_attempts p WHERE p.id = l.payment_attempt_id)")
        if any(int(n) for _, n in orphans):
            raise Failure("rows of no attempt: %s" % orphans)
        # Attempts whose answer was lost after the provider executed are never FAILED.
        hits = self.psp_get("/faults").get("hits", [])
        after = {h["key"] for h in hits if h["kind"] in ("error_after", "drop_after", "stall_after")}
        for a in attempts:
            if a["key"] in after and a["status"] == "FAILED" and "declined" not in a["reason"]:
                raise Failure("attempt %s hit by an after-execute fault is FAILED" % a["id"])
        # Offsets: everything consumed is committed.
        lag = self.lag()
        if lag["lag"] != 0:
            raise Failure("committed offsets are behind the end: %s" % lag)
        counts = {}
        for a in attempts:
            counts[a["status"]] = counts.get(a["status"], 0) + 1
        log("invariants hold:", counts, "provider charges", len(ledger),
            "after-execute faults", len(after))
        return counts


    # ---- refunds ----

    def refunds(self):
        rows = self.query("SELECT id, payment_attempt_id, idempotency_key, amount, status,"
                          " coalesce(provider_refund_id, ''), coalesce(reason, '')"
                          " FROM refund_attempts")
        return [dict(zip(("id", "attempt", "key", "amount", "status", "prid", "reason"), r))
                for r in rows]

    def wait_refunds_settled(self, n, timeout, statuses=("PENDING", "PROCESSING")):
        """Until n refunds exist and none is in `statuses` (by default: none
        the worker still owes an outcome)."""
        def done():
            rows = self.query("SELECT count(*), count(*) FILTER (WHERE status = ANY('{%s}'))"
                              " FROM refund_attempts" % ",".join(statuses))
            return int(rows[0][0]) >= n and int(rows[0][1]) == 0
        wait_until("%d refunds settled" % n, done, timeout, 0.3)

    def check_refund_invariants(self):
        """What the provider actually refunded, against what we recorded:
        no refund key executed twice, no charge refunded beyond its amount,
        every SUCCEEDED refund exactly one provider refund, and the books
        (refunded_amount, ledger rows, events) agree."""
        ledger = self.psp_get("/ledger")
        executed = ledger.get("refund_executions", {})
        twice = {k: n for k, n in executed.items() if int(n) > 1}
        if twice:
            raise Failure("refund keys executed more than once: %s" % list(twice)[:5])
        rows = ledger["refunds"]
        charges = {c["payment_intent_id"]: int(c["amount"]) for c in self.ledger()
                   if c["outcome"] == "succeeded"}
        by_intent = {}
        for r in rows:
            if r["status"] not in ("failed", "canceled"):
                by_intent[r["payment_intent_id"]] = by_intent.get(
                    r["payment_intent_id"], 0) + int(r["amount"])
        for pi, total in by_intent.items():
            if total > charges.get(pi, 0):
                raise Failure("intent %s refunded %d of a charge of %s" % (
                    pi, total, charges.get(pi)))
        by_refund = {}
        for r in rows:
            by_refund.setdefault((r.get("metadata") or {}).get("refund_id"), []).append(r)
        refunds = self.refunds()
        for f in refunds:
            got = by_refund.get(f["id"], [])
            if f["status"] == "SUCCEEDED":
                ok = [r for r in got if r["status"] == "succeeded"]
                if len(ok) != 1 or ok[0]["provider_refund_id"] != f["prid"] or \
                        int(ok[0]["amount"]) != int(f["amount"]):
                    raise Failure("SUCCEEDED refund %s has provider refunds %s" % (f, got))
            if f["status"] in ("FAILED", "REJECTED") and \
                    any(r["status"] == "succeeded" for r in got):
                raise Failure("%s refund %s was refunded at the provider" % (f["status"], f))
        books = self.query(
            "SELECT p.id, p.refunded_amount, p.refund_reserved,"
            " coalesce((SELECT sum(amount) FROM refund_attempts r WHERE r.payment_attempt_id"
            "  = p.id AND r.status = 'SUCCEEDED'), 0),"
            " coalesce((SELECT sum(amount) FROM ledger_entries l WHERE l.payment_attempt_id"
            "  = p.id AND l.kind = 'refund'), 0)"
            " FROM payment_attempts p")
        for aid, refunded, reserved, succeeded, booked in books:
            if not (int(refunded) == int(succeeded) == int(booked) <= int(reserved)):
                raise Failure("attempt %s: refunded %s, SUCCEEDED refunds %s, ledger %s,"
                              " reserved %s" % (aid, refunded, succeeded, booked, reserved))
        events = self.query("SELECT refund_id, event_type, count(*) FROM outbox"
                            " WHERE refund_id IS NOT NULL GROUP BY 1, 2")
        dup = [e for e in events if int(e[2]) > 1 and e[1] in (
            "refund.succeeded", "refund.failed", "refund.rejected")]
        if dup:
            raise Failure("refund events written twice: %s" % dup[:5])
        seen = {(e[0], e[1]) for e in events}
        for f in refunds:
            want = {"SUCCEEDED": "refund.succeeded", "FAILED": "refund.failed",
                    "REJECTED": "refund.rejected"}.get(f["status"])
            if want and (f["id"], want) not in seen:
                raise Failure("refund %s is %s without its %s event" % (f["id"], f["status"], want))
        counts = {}
        for f in refunds:
            counts[f["status"]] = counts.get(f["status"], 0) + 1
        log("refund invariants hold:", counts, "provider refunds", len(rows))
        return counts


def hold_statements(s, key, event, when):
    """Makes the statements of `event` ("INSERT", "UPDATE") on
    payment_attempts whose rows match `when` (SQL over NEW and OLD) wait for
    the advisory lock `key` for as long as someone holds it: each wait ends
    at the session's lock_timeout and the trigger waits again, so the
    statement never gives up. A lock forced, not hoped for."""
    s.psql(s.db, """
CREATE FUNCTION test_wait_for_hold() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
  LOOP
    BEGIN
      PERFORM pg_advisory_xact_lock(%d);
      RETURN NEW;
    EXCEPTION WHEN lock_not_available THEN
      NULL; -- the session's lock_timeout: wait again
    END;
  END LOOP;
END $$;
CREATE TRIGGER test_wait_for_hold BEFORE %s ON payment_attempts
  FOR EACH ROW WHEN (%s) EXECUTE FUNCTION test_wait_for_hold();
""" % (key, event, when))


class Session:
    """One psql session kept open, so that a scenario can hold a transaction
    (and its locks) across its steps: a race is forced by holding a lock,
    not hoped for by repetition. Statements run one at a time; run() waits
    for each to finish (or, with wait=False, only sends it)."""

    def __init__(self, url):
        self.p = subprocess.Popen(["psql", "-X", "-q", "-tA", "-v", "ON_ERROR_STOP=1", url],
                                  stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                  stderr=subprocess.STDOUT)
        self.n = 0
        self.pid = int(self.run("SELECT pg_backend_pid()")[0][0])

    def run(self, sql, timeout=30):
        """Rows of sql as lists of strings, once it has finished."""
        import select
        self.n += 1
        marker = "__charged_session_done_%d__" % self.n
        self.p.stdin.write(("%s;\n\\echo %s\n" % (sql.rstrip().rstrip(";"), marker)).encode())
        self.p.stdin.flush()
        # Read the descriptor itself: a buffered readline() could take the
        # marker into its buffer, where select() never sees it.
        fd, buf = self.p.stdout.fileno(), b""
        deadline = time.monotonic() + scaled(timeout)
        while ("\n%s\n" % marker).encode() not in b"\n" + buf:
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([fd], [], [], left)[0]:
                raise Failure("psql session: %r did not finish within %ss" % (sql[:80], timeout))
            chunk = os.read(fd, 65536)
            if not chunk:
                raise Failure("psql session ended running %r: %s" % (sql[:80], buf[-500:]))
            buf += chunk
        lines = buf.decode().split("\n")
        return [l.split("|") for l in lines[:lines.index(marker)] if l]

    def close(self):
        if self.p.poll() is None:
            self.p.stdin.close()
            self.p.wait(timeout=scaled(30))


def run_scenarios(scenarios):
    """The scenario function of a file of scenarios: runs those the command
    line names (all by default) in order, each on Scenarios of its own,
    closed once it passed."""
    def scenario(new):
        wanted = sys.argv[1:]
        # `--except A B`: all but those (the test command runs the ones that
        # stop a shared server apart from the rest, docs/testing.md).
        excluded = wanted[1:] if wanted[:1] == ["--except"] else []
        if excluded:
            wanted = [f.__name__ for f in scenarios if f.__name__ not in excluded]
        names = [f.__name__ for f in scenarios]
        unknown = [w for w in wanted + excluded if w not in names]
        check(not unknown, "no such scenario: %s (have %s)" % (unknown, names))
        made = []

        def tracked(*a, **k):
            s = new(*a, **k)
            made.append(s)
            return s
        for fn in [f for f in scenarios if not wanted or f.__name__ in wanted]:
            t0 = time.monotonic()
            log("----", fn.__name__)
            fn(tracked)
            log("----", fn.__name__, "passed in %.1fs" % (time.monotonic() - t0))
            while made:
                made.pop().close()
    return scenario


def main(scenario_fn):
    """Runs one scenario function with a fresh Scenario factory; exit 0 / 1."""
    scenarios = []

    def factory(*a, **k):
        s = Scenario(*a, **k)
        scenarios.append(s)
        return s
    try:
        scenario_fn(factory)
        print("1 passed, 0 failed")
        return 0
    except Exception as e:  # a failed assertion or a crash of the harness
        import traceback
        traceback.print_exc()
        for s in scenarios:
            print("logs of %s are in %s" % (s.name, s.dir), file=sys.stderr)
        print("0 passed, 1 failed")
        return 1
    finally:
        for s in scenarios:
            s.close()
