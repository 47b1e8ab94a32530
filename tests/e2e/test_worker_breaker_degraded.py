#!/usr/bin/env python3
"""The provider breaker under partial degradation and against a provider
whose look-ups fail while its charges work.

1. degraded: a seeded psp-sim answers 10% of charges 5xx before executing
   and 10% 5xx after (20% failing, spread over 64 calls in flight). With the
   default breaker it never opens, and every attempt is SUCCEEDED (retried
   with its key, or settled by the reconciler), charged once. (A breaker
   counting failures in a row opened again and again here, pausing every
   partition each time: 36 charges/s against 1,093 with it off.)
2. look-ups fail, charges work: after an outage (a proxy in front of
   psp-sim answers 503 to everything) opens the breaker, the proxy serves
   charges again but still answers 503 to every GET. The breaker's probe
   asks the charge endpoint, so it closes and the commands are charged.
   (A probe that looked an intent up kept it open: 0 of 8 charged in 60 s.)
"""
import http.client
import http.server
import os
import threading

import charged_e2e as e2e
from charged_e2e import check, check_eq


def opened(s, w):
    return s.worker_log(w, "provider breaker opened")


def degraded(new):
    s = new("breaker_degraded", partitions=6,
            psp_args=["--seed", "20261201", "--fault", "error_before=0.1",
                      "--fault", "error_after=0.1"])
    w = s.start_worker(RECONCILER_FIRST_LOOK_MS="500")
    s.start_reconciler(RECONCILER_SCHEDULE_MS="300", RECONCILER_POLL_MS="100")
    cmds = [e2e.new_command() for _ in range(600)]
    s.publish(cmds)
    s.wait_settled(len(cmds), 180)
    e2e.wait_until("every attempt settled by the worker or the reconciler", lambda: s.query(
        "SELECT count(*) FROM payment_attempts WHERE status <> 'SUCCEEDED'") == [["0"]], 120)
    hits = s.psp_get("/faults").get("hits", [])
    check(len(hits) >= 60, "psp-sim injected only %d faults" % len(hits))
    check_eq(opened(s, w), [], "breaker openings under 20% errors")
    check_eq(s.admin_metrics(w).get("charged_provider_breaker_opens_total", 0.0), 0.0,
             "charged_provider_breaker_opens_total")
    counts = s.check_invariants()
    check_eq(counts, {"SUCCEEDED": 600}, "attempts by status")
    e2e.log("faults injected:", len(hits))


class Proxy:
    """Forwards to psp-sim; `mode` says what it answers 503 to: "all",
    "get" (look-ups) or "" (nothing)."""

    def __init__(self, target_port):
        proxy = self
        self.mode = ""

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *a):
                pass

            def forward(self):
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                if proxy.mode == "all" or (proxy.mode == "get" and self.command == "GET"):
                    self.answer(503, b'{"error":{"type":"api_error","message":"proxy"}}', {})
                    return
                c = http.client.HTTPConnection("127.0.0.1", target_port, timeout=30)
                try:
                    c.request(self.command, self.path, body=body or None,
                              headers={k: v for k, v in self.headers.items()
                                       if k.lower() not in ("host", "connection")})
                    r = c.getresponse()
                    self.answer(r.status, r.read(), dict(r.getheaders()))
                finally:
                    c.close()

            def answer(self, status, body, headers):
                self.send_response(status)
                for k, v in headers.items():
                    if k.lower() not in ("content-length", "connection", "transfer-encoding",
                                         "date", "server"):
                        self.send_header(k, v)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            do_GET = do_POST = forward

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.port = self.server.server_address[1]
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self):
        self.server.shutdown()
        self.server.server_close()


def lookups_fail(new):
    s = new("breaker_lookups_fail", partitions=3)
    proxy = Proxy(s.psp_port)
    try:
        w = s.start_worker(PROVIDER_BASE_URL="http://127.0.0.1:%d" % proxy.port,
                           PROVIDER_BREAKER_MIN_CALLS="5", PROVIDER_BREAKER_OPEN_MS="500",
                           PROVIDER_BREAKER_PROBES="2", PROVIDER_TIMEOUT_MS="1000")
        e2e.wait_until("worker ready", lambda: s.admin_get(w, "/readyz")[0] == 200, 60)
        proxy.mode = "all"
        cmds = [e2e.new_command() for _ in range(8)]
        s.publish(cmds)
        e2e.wait_until("the breaker to open in the outage", lambda: opened(s, w), 60)
        # Charges work again; look-ups do not.
        proxy.mode = "get"
        e2e.wait_until("the breaker to close", lambda: s.worker_log(
            w, "provider breaker closed"), 30)
        s.wait_settled(len(cmds), 60)
        check_eq(s.query("SELECT status, count(*) FROM payment_attempts GROUP BY 1"),
                 [["SUCCEEDED", "8"]], "attempts by status")
        e2e.wait_until("worker ready again", lambda: s.admin_get(w, "/readyz")[0] == 200, 30)
        s.check_invariants()
    finally:
        proxy.close()


def scenario(new):
    only = os.environ.get("BREAKER_CASE")
    for case in (degraded, lookups_fail):
        if not only or only == case.__name__:
            e2e.log("== case", case.__name__)
            case(new)


if __name__ == "__main__":
    raise SystemExit(e2e.main(scenario))
