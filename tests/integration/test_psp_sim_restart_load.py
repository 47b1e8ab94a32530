#!/usr/bin/python3
"""psp-sim --state-file under load: test_psp_sim_restart_load.py PSP_SIM.

Three rounds on one state file: clients charge a pool of keys (several
clients at once on one key, card methods that succeed, decline or stay
processing), refund and cancel the intents they got, with latency so that
requests are in flight, and psp-sim is SIGKILLed in the middle of it. After
each restart:
- every charge, refund and cancel that was answered (not a replay, not an
  error) is in GET /ledger, once for its key;
- no key has more than one charge, one refund or one cancel in the ledger;
- a retry of every answered key replays the answer it got, byte for byte;
- the books are the same after one more kill and restart with no load.
"""
import http.client
import json
import os
import random
import re
import signal
import subprocess
import sys
import tempfile
import threading
import time

API_KEY = "sk_test_restart_load"
METHODS = ["pm_card_visa", "pm_card_chargeDeclined", "pm_card_processing",
           "pm_card_refundPending"]


def fail(msg):
    print("FAIL: " + msg)
    sys.exit(1)


class Sim:
    def __init__(self, binary, state_file):
        self.binary, self.state_file = binary, state_file
        self.proc, self.port, self.admin_port = None, 0, 0

    def start(self, *extra):
        args = [self.binary, "--port", str(self.port), "--admin-port",
                str(self.admin_port), "--api-key", API_KEY, "--state-file",
                self.state_file, *extra]
        self.proc = subprocess.Popen(args, stdout=subprocess.DEVNULL,
                                     stderr=subprocess.PIPE, text=True)
        self.wait_listening()

    def wait_listening(self):
        line = self.proc.stderr.readline()
        while line and "listening on" not in line:
            line = self.proc.stderr.readline()
        ports = re.findall(r":(\d+) \(admin http://[^:]+:(\d+)\)", line)
        if not ports:
            fail(f"psp-sim did not start: {line!r} rc={self.proc.poll()}")
        self.port, self.admin_port = int(ports[0][0]), int(ports[0][1])
        threading.Thread(target=self.proc.stderr.read, daemon=True).start()

    def kill(self):
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait()

    def post(self, path, key, form, timeout=10):
        c = http.client.HTTPConnection("127.0.0.1", self.port, timeout=timeout)
        try:
            c.request("POST", path, form, {
                "Authorization": "Bearer " + API_KEY, "Idempotency-Key": key,
                "Content-Type": "application/x-www-form-urlencoded"})
            r = c.getresponse()
            body = r.read().decode()
            return r.status, body, r.getheader("Idempotent-Replayed") == "true"
        finally:
            c.close()

    def ledger(self):
        c = http.client.HTTPConnection("127.0.0.1", self.admin_port, timeout=10)
        c.request("GET", "/ledger")
        books = json.loads(c.getresponse().read())
        c.close()
        for k in ("charges_in_flight", "max_charges_in_flight"):
            books["counters"].pop(k, None)
        return books


def charge_form(key):
    pm = METHODS[sum(key.encode()) % len(METHODS)]
    return (f"amount=1500&currency=eur&payment_method={pm}&confirm=true"
            f"&metadata%5Border_id%5D=o-{key}&metadata%5Bpayment_attempt_id%5D=a-{key}")


class Load:
    """What the clients were answered: key -> (path, form, status, body)."""

    def __init__(self, sim, round_no):
        self.sim, self.round = sim, round_no
        self.answered, self.intents = {}, []
        self.lock, self.stop = threading.Lock(), threading.Event()

    def note(self, key, path, form, status, body, replayed):
        if status not in (200, 402):
            return
        with self.lock:
            if not replayed:
                if key in self.answered and self.answered[key][3] != body:
                    fail(f"key {key} executed twice: {self.answered[key][3]} / {body}")
                self.answered[key] = (path, form, status, body)
            if path == "/v1/payment_intents" and status == 200:
                self.intents.append(json.loads(body)["id"])

    def client(self, seed):
        rnd = random.Random(seed)
        while not self.stop.is_set():
            what = rnd.random()
            with self.lock:
                pi = rnd.choice(self.intents) if self.intents else None
            if what < 0.6 or not pi:
                key = f"c{self.round}-{rnd.randrange(60)}"
                path, form = "/v1/payment_intents", charge_form(key)
            elif what < 0.85:
                key = f"r{self.round}-{rnd.randrange(40)}"
                path = "/v1/refunds"
                form = f"payment_intent={pi}&amount={rnd.choice([300, 700, 1500])}"
                # One key, one refund request: the key names its parameters.
                form = self.refund_forms.setdefault(key, form)
            else:
                key = f"x{self.round}-{rnd.randrange(20)}"
                pi = self.cancel_targets.setdefault(key, pi)
                path, form = f"/v1/payment_intents/{pi}/cancel", ""
            try:
                status, body, replayed = self.sim.post(path, key, form)
            except (OSError, http.client.HTTPException):
                continue  # killed under it: no answer, nothing to hold it to
            self.note(key, path, form, status, body, replayed)

    def run(self, seconds, clients=8):
        self.refund_forms, self.cancel_targets = {}, {}
        threads = [threading.Thread(target=self.client, args=(self.round * 100 + i,))
                   for i in range(clients)]
        for t in threads:
            t.start()
        time.sleep(seconds)  # the load's length; the kill comes in its middle
        self.sim.kill()
        self.stop.set()
        for t in threads:
            t.join()


def check_books(sim, answered):
    books = sim.ledger()
    for kind, rows in (("charge", books["charges"]), ("refund", books["refunds"]),
                       ("cancel", books["cancels"])):
        seen = {}
        for row in rows:
            k = row.get("idempotency_key")
            if k is not None:
                seen[k] = seen.get(k, 0) + 1
        for k, n in seen.items():
            if n > 1:
                fail(f"{kind} key {k} is in the ledger {n} times")
        prefix = {"charge": "c", "refund": "r", "cancel": "x"}[kind]
        for k in answered:
            if k.startswith(prefix) and k not in seen:
                fail(f"answered {kind} {k} is missing from the ledger")
    for key, (path, form, status, body) in sorted(answered.items()):
        got = sim.post(path, key, form)
        if got != (status, body, True):
            fail(f"retry of {key} answered {got[0]} {got[1]!r} (replayed "
                 f"{got[2]}), before the kill {status} {body!r}")
    return books


def main():
    binary = sys.argv[1]
    with tempfile.TemporaryDirectory() as d:
        sim = Sim(binary, os.path.join(d, "books.jsonl"))
        sim.start("--latency-ms", "5", "--latency-jitter-ms", "40",
                  "--processing-settle-ms", "300", "--refund-settle-ms", "200")
        answered = {}
        for round_no in range(3):
            load = Load(sim, round_no)
            load.run(2.0)
            answered.update(load.answered)
            sim.start("--latency-ms", "5", "--latency-jitter-ms", "40",
                      "--processing-settle-ms", "300", "--refund-settle-ms", "200")
            check_books(sim, answered)
            print(f"round {round_no}: {len(load.answered)} answered, "
                  f"{len(answered)} in all, held across the kill")
        # Settled first (a read settles what is due): an idle restart must
        # then change nothing.
        deadline = time.monotonic() + 10
        while True:
            before = sim.ledger()
            c = before["counters"]
            if c["processing"] == 0 and c["refunds_pending"] == 0:
                break
            if time.monotonic() > deadline:
                fail(f"never settled: {c}")
            time.sleep(0.05)
        sim.kill()
        sim.start("--latency-ms", "5", "--latency-jitter-ms", "40",
                  "--processing-settle-ms", "300", "--refund-settle-ms", "200")
        after = sim.ledger()
        if before != after:
            fail(f"books changed by an idle restart:\n{before}\n{after}")
        sim.kill()
    print("ok")


if __name__ == "__main__":
    main()
