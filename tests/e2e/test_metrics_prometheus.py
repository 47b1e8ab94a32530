#!/usr/bin/env python3
"""A real Prometheus scrapes a worker, a reconciler, a relay and an auditor every second
during a run of charge commands; once the run is settled, what Prometheus
stored agrees with the database:

- sum(charged_attempts_processed_total) = the attempts in the database (the
  worker settled every one of them);
- charged_messages_total: `settled` = those attempts, `already_settled` = the
  duplicates published, `dead_lettered` = the letters on the DLQ, and the
  sum = every message published;
- the charge requests the histogram counted = the charge responses counted
  = the worker's rows in provider_calls;
- sum(charged_outbox_published_total) = the outbox rows marked published;
- the consumer lag Prometheus last saw is 0;
- the auditor counted every intent psp-sim holds, and once psp-sim is given
  a second charge of one attempt under a new key, one charged_twice;

and `promtool check metrics` passes on a scrape of each role. Prometheus
(/usr/bin/prometheus) runs with its own configuration and storage in the
scenario's directory, on a loopback port, and is stopped whatever happens.
A missing prometheus or promtool fails the test: deploy/install-deps.sh
installs both.
"""
import json
import os
import shutil
import subprocess
import sys
import time
import urllib.error
import urllib.parse
import urllib.request

import charged_e2e as e2e
from charged_e2e import check, check_eq

N_VISA, N_DECLINED, N_DUPLICATES, N_BAD = 200, 40, 10, 5


def tool(name):
    path = shutil.which(name) or ("/usr/bin/" + name if os.path.exists("/usr/bin/" + name)
                                  else None)
    check(path, "%s not found: run deploy/install-deps.sh (Debian package prometheus)" % name)
    return path


class Prometheus:
    """A Prometheus server scraping `targets` (host:port) every second."""

    def __init__(self, directory, targets):
        self.binary = tool("prometheus")
        self.dir = os.path.join(directory, "prometheus")
        os.makedirs(os.path.join(self.dir, "data"), exist_ok=True)
        self.config = os.path.join(self.dir, "prometheus.yml")
        with open(self.config, "w") as f:
            f.write("global:\n  scrape_interval: 1s\n  scrape_timeout: 1s\n"
                    "scrape_configs:\n  - job_name: charged\n    static_configs:\n"
                    "      - targets: [%s]\n" % ", ".join("'%s'" % t for t in targets))
        self.proc = None
        self.log = open(os.path.join(self.dir, "prometheus.log"), "ab")
        # Prometheus names no port it picked itself: choose one, and choose
        # again if another process took it first (it then exits at once).
        for _ in range(5):
            self.port = e2e.free_port()
            self.proc = subprocess.Popen(
                [self.binary, "--config.file=" + self.config,
                 "--storage.tsdb.path=" + os.path.join(self.dir, "data"),
                 "--web.listen-address=127.0.0.1:%d" % self.port,
                 "--storage.tsdb.retention.time=1h"],
                stdout=self.log, stderr=self.log, stdin=subprocess.DEVNULL)
            try:
                e2e.wait_until("prometheus ready on :%d" % self.port, self._ready, 60)
                e2e.log("prometheus pid", self.proc.pid, "on port", self.port)
                return
            except e2e.Failure:
                if self.proc.poll() is None:
                    self.stop()  # up but never ready: not left behind
                    raise
                e2e.log("prometheus exited %s on port %d; trying another" % (
                    self.proc.returncode, self.port))
        self.stop()
        raise e2e.Failure("prometheus did not start; see %s" % self.log.name)

    def _ready(self):
        check(self.proc.poll() is None, "prometheus exited %s" % self.proc.returncode)
        try:
            with urllib.request.urlopen("http://127.0.0.1:%d/-/ready" % self.port,
                                        timeout=5) as r:
                return r.status == 200
        except OSError:
            return False

    def query(self, expr):
        """The instant vector of expr as {frozenset(labels): float}."""
        url = "http://127.0.0.1:%d/api/v1/query?%s" % (
            self.port, urllib.parse.urlencode({"query": expr}))
        with urllib.request.urlopen(url, timeout=10) as r:
            body = json.load(r)
        check_eq(body.get("status"), "success", "status of the query %s" % expr)
        return dict((frozenset(v["metric"].items()), float(v["value"][1]))
                    for v in body["data"]["result"])

    def scalar(self, expr):
        """The single value of expr, or None when it has no series."""
        v = self.query(expr)
        check(len(v) <= 1, "%s: want at most one series, got %s" % (expr, v))
        return next(iter(v.values())) if v else None

    def wait_equal(self, expr, want, timeout=60):
        last = [None]

        def equal():
            last[0] = self.scalar(expr)
            return last[0] == want
        try:
            e2e.wait_until("prometheus: %s = %s" % (expr, want), equal, timeout, 0.5)
        except e2e.Failure:
            raise e2e.Failure("prometheus: %s is %r, want %r" % (expr, last[0], want))
        e2e.log("prometheus: %s = %s" % (expr, want))

    def stop(self):
        """Stops Prometheus (SIGTERM, then SIGKILL); safe to call twice."""
        if self.proc and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=e2e.scaled(30))
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=e2e.scaled(30))
        if not self.log.closed:
            self.log.close()


def promtool_check(s, name, promtool):
    status, text = s.admin_get(name, "/metrics")
    check_eq(status, 200, "GET /metrics of %s" % name)
    p = subprocess.run([promtool, "check", "metrics"], input=text.encode(),
                       capture_output=True, timeout=e2e.scaled(60))
    check(p.returncode == 0, lambda: "promtool check metrics on %s's scrape exited %d: %s" % (
        name, p.returncode, (p.stdout + p.stderr).decode()[-3000:]))
    e2e.log("promtool check metrics: %s's scrape passes (%d lines)" % (
        name, len(text.splitlines())))


def scenario(new):
    promtool = tool("promtool")
    tool("prometheus")
    s = new("metrics_prometheus", psp_args=["--latency-ms", "2", "--latency-jitter-ms", "8"])
    w = s.start_worker()
    r = s.start_reconciler()
    rl = s.start_relay(RELAY_POLL_MS=100, RELAY_BACKLOG_LOG_MS=500)
    au = s.start_auditor(AUDITOR_WINDOW_MS=2000, AUDITOR_LAG_MS=1500, AUDITOR_POLL_MS=200,
                         AUDITOR_FROM=int(time.time()) - 2)
    names = {w: "worker", r: "reconciler", rl: "relay", au: "auditor"}
    prom = Prometheus(s.dir, ["127.0.0.1:%d" % s.admin_port(n) for n in names])
    try:
        e2e.wait_until("prometheus scraping all four", lambda: prom.scalar(
            'sum(up{job="charged"})') == 4, 60, 0.5)

        cmds = ([e2e.new_command() for _ in range(N_VISA)] +
                [e2e.new_command(payment_method="pm_card_chargeDeclined")
                 for _ in range(N_DECLINED)])
        s.publish(cmds + cmds[:N_DUPLICATES])
        s.produce_raw([{"key": "bad-%d" % i, "value": "{not json", "headers": []}
                       for i in range(N_BAD)])
        s.wait_settled(len(cmds), timeout=180)

        attempts = int(s.query("SELECT count(*) FROM payment_attempts")[0][0])
        check_eq(attempts, len(cmds), "attempts in the database")
        # The Done-when: Prometheus holds what the database holds.
        prom.wait_equal("sum(charged_attempts_processed_total)", float(attempts))
        prom.wait_equal('sum(charged_messages_total{outcome="settled"})', float(attempts))
        prom.wait_equal('sum(charged_messages_total{outcome="already_settled"})',
                        float(N_DUPLICATES))
        dead = len(s.dead_letters())
        check_eq(dead, N_BAD, "dead letters on the DLQ")
        prom.wait_equal('sum(charged_messages_total{outcome="dead_lettered"})', float(dead))
        prom.wait_equal('sum(charged_dead_letters_total{reason="malformed_json"})', float(dead))
        prom.wait_equal("sum(charged_messages_total)",
                        float(len(cmds) + N_DUPLICATES + N_BAD))
        by_status = dict(s.query("SELECT status, count(*) FROM payment_attempts GROUP BY 1"))
        for status, n in by_status.items():
            prom.wait_equal('sum(charged_attempts_processed_total{status="%s"})' % status,
                            float(n))
        # Requests that ended, so not the rows of answers lost when curl
        # re-sent a request on a pooled connection (recorded as calls too).
        calls = int(s.query("SELECT count(*) FROM provider_calls WHERE operation = 'charge' "
                            "AND actor = '%s' AND coalesce(error, '') NOT LIKE "
                            "'connection closed without an answer%%'" % s.worker_ids[w])[0][0])
        check(calls >= attempts, "fewer charge calls (%d) than attempts (%d)" % (calls, attempts))
        prom.wait_equal('sum(charged_provider_request_duration_seconds_count'
                        '{operation="charge"})', float(calls))
        prom.wait_equal('sum(charged_provider_responses_total{operation="charge"})',
                        float(calls))

        def all_published():
            return int(s.query("SELECT count(*) FROM outbox WHERE published_at IS NULL")[0][0]) == 0
        e2e.wait_until("the outbox published", all_published, 120)
        events = int(s.query("SELECT count(*) FROM outbox")[0][0])
        prom.wait_equal("sum(charged_outbox_published_total)", float(events))
        prom.wait_equal("sum(charged_outbox_backlog_events)", 0.0)
        # Lag comes from librdkafka's statistics, every 5 s.
        prom.wait_equal("sum(charged_consumer_lag_messages)", 0.0)
        prom.wait_equal('sum(charged_ready{job="charged"})', 4.0)
        buckets = prom.query('charged_provider_request_duration_seconds_bucket'
                             '{operation="charge",le="+Inf"}')
        check_eq(list(buckets.values()), [float(calls)], "the +Inf bucket of the charges")

        # The auditor: every intent psp-sim made, then the promise broken.
        intents = s.psp_get("/ledger")["counters"]["intents"]
        prom.wait_equal('sum(charged_audit_objects_total{object="intent"})', float(intents))
        prom.wait_equal('sum(charged_audit_findings_total{kind="charged_twice"}) or vector(0)',
                        0.0)
        first = s.query("SELECT provider_payment_id FROM payment_attempts"
                        " WHERE status = 'SUCCEEDED' LIMIT 1")[0][0]
        s.psp_put("/inject/intents", {"like": first}, method="POST")
        prom.wait_equal('sum(charged_audit_findings_total{kind="charged_twice"})', 1.0)
        prom.wait_equal('sum(charged_audit_objects_total{object="intent"})',
                        float(intents + 1))
        for n in names:
            promtool_check(s, n, promtool)
        s.check_invariants()
    finally:
        prom.stop()


if __name__ == "__main__":
    sys.exit(e2e.main(scenario))
