"""charged api, POST /v1/webhooks/provider, under random input: random
bodies (bytes, JSON-ish, huge), random and hostile headers, random
signatures, and bytes that are not HTTP at all. Every unsigned or badly
signed delivery gets a 4xx; signed garbage gets a 4xx; signed mutations of
a real event get 200 or 4xx, never 5xx; the process never crashes, and a
real delivery still works at the end. FUZZ_SEED reproduces a run."""

import json
import os
import random
import socket
import time

import charged_api as api
import charged_e2e as e2e
from charged_e2e import check, check_eq

ROUNDS = int(os.environ.get("FUZZ_ROUNDS", "600"))


def random_bytes(rnd, n):
    return bytes(rnd.getrandbits(8) for _ in range(n))


def random_text(rnd, n):
    alphabet = "abcdefghijklmnopqrstuvwxyz0123456789=,;:. _-tv1\"{}[]\\"
    return "".join(rnd.choice(alphabet) for _ in range(n))


def mutate(rnd, doc):
    """A structural change somewhere in a JSON document."""
    if isinstance(doc, dict) and doc:
        k = rnd.choice(list(doc))
        r = rnd.random()
        if r < 0.25:
            del doc[k]
        elif r < 0.5:
            doc[k] = rnd.choice([None, 0, -1, 2 ** 63, 1e308, "", "x" * rnd.randint(1, 3000),
                                 [], {}, True, "\u00e9\ud7ff", "pi_" + random_text(rnd, 8)])
        else:
            doc[k] = mutate(rnd, doc[k])
        return doc
    if isinstance(doc, list):
        return doc + [mutate(rnd, {"a": 1})]
    return rnd.choice([None, 1, "s", {"deep": [[[[{}]]]]}, [1, 2]])


def scenario(make):
    seed = int(os.environ.get("FUZZ_SEED", str(int(time.time()))))
    e2e.log("FUZZ_SEED=%d" % seed)
    rnd = random.Random(seed)
    s = make("api_fuzz", partitions=1)
    name, port = api.start_api(s, API_MAX_BODY_BYTES=16384, API_MAX_CONNECTIONS_PER_IP=16)
    proc = s.apis[name]
    a = api.insert_attempt(s, "UNKNOWN", ppid="pi_fuzz_real_0001")
    real = api.event("succeeded", a)
    statuses = {}

    def note(kind, st):
        statuses.setdefault(kind, {}).setdefault(st, 0)
        statuses[kind][st] += 1

    for i in range(ROUNDS):
        kind = rnd.choice(["bytes", "json", "header", "signed-garbage", "signed-mutation"])
        if kind == "bytes":
            body = random_bytes(rnd, rnd.choice([0, 1, 10, 500, 20000]))
            header = rnd.choice([None, "", api.sign(body, "whsec_wrong_secret_x")])
        elif kind == "json":
            body = json.dumps(mutate(rnd, json.loads(json.dumps(real)))).encode()
            header = rnd.choice([None, api.sign(body, "whsec_wrong_secret_x"),
                                 api.sign(body, t=int(time.time()) - 10000)])
        elif kind == "header":
            body = json.dumps(real).encode()
            header = random_text(rnd, rnd.choice([0, 5, 80, 3000]))
        elif kind == "signed-garbage":
            body = random_bytes(rnd, rnd.choice([1, 50, 900]))
            header = api.sign(body)
        else:
            ev = mutate(rnd, json.loads(json.dumps(real)))
            if isinstance(ev, dict):
                ev["id"] = "evt_fuzz_%d" % i  # a new event each time
            body = json.dumps(ev).encode()
            header = api.sign(body)
        extra = {}
        if rnd.random() < 0.3:
            extra["X-" + random_text(rnd, 6).replace(" ", "a").replace("\"", "b")
                  .replace(",", "c").replace(":", "d").replace("{", "e").replace("}", "f")
                  .replace("[", "g").replace("]", "h").replace("\\", "i").replace("=", "j")
                  .replace(";", "k")] = random_text(rnd, 40)
        if rnd.random() < 0.1:
            extra["Content-Type"] = random_text(rnd, 12)
        try:
            st, doc = api.post_webhook(port, body, header=header, extra_headers=extra)
        except (OSError, ValueError) as err:
            check(proc.poll() is None, "the api died on round %d (%s): %s" % (i, kind, err))
            st = "closed"
        note(kind, st)
        if kind == "signed-mutation":
            check(st == "closed" or st == 200 or 400 <= st < 500,
                  "round %d (%s) answered %s" % (i, kind, st))
        else:
            check(st == "closed" or 400 <= st < 500, "round %d (%s) answered %s" % (i, kind, st))
        check(proc.poll() is None, "the api exited %s on round %d (%s)" % (proc.returncode, i, kind))

    # Bytes that are not HTTP, and a request cut in the middle of its body.
    for junk in [b"\x00\xff" * 100, b"GET / HTTP/9.9\r\n\r\n", b"POST /v1/webhooks/provider HTTP/1.1\r\n"
                 b"Host: x\r\nContent-Length: 100000000\r\n\r\nabc",
                 b"POST /v1/webhooks/provider HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n"
                 b"ffffffff\r\n" + b"a" * 40000]:
        with socket.create_connection(("127.0.0.1", port), timeout=e2e.scaled(10)) as c:
            c.sendall(junk)
            c.shutdown(socket.SHUT_WR)
            try:
                reply = c.recv(200)
            except OSError:
                reply = b""
            if reply:
                code = int(reply.split(b" ", 2)[1])
                # 505 is the protocol's own answer to an HTTP version that
                # does not exist.
                check(400 <= code < 500 or (code == 505 and b"HTTP/9.9" in junk),
                      "answer %r to junk %r" % (reply[:40], junk[:30]))
        check(proc.poll() is None, "the api exited on junk %r" % junk[:30])
    e2e.log("answers by kind:", statuses)

    # Slow clients from one address hold at most API_MAX_CONNECTIONS_PER_IP
    # connections (16 here): a provider delivering from another address is
    # still answered while they dribble their headers.
    slow = []
    try:
        for _ in range(100):
            c = socket.socket()
            c.settimeout(e2e.scaled(5))
            c.bind(("127.0.0.2", 0))
            try:
                c.connect(("127.0.0.1", port))
                c.sendall(b"POST /v1/webhooks/provider HTTP/1.1\r\nHost: x\r\n")
            except OSError:
                c.close()
                continue
            slow.append(c)
        b0 = api.insert_attempt(s, "UNKNOWN", ppid="pi_fuzz_slow_0001")
        st, doc = api.post_webhook(port, api.event("succeeded", b0))
        check_eq((st, doc["result"]), (200, "applied"), "a delivery while 100 slow clients wait")
        alive = 0
        for c in slow:
            try:
                c.sendall(b"X-Slow: 1\r\n")
                c.settimeout(0.05)
                alive += c.recv(1) != b""
            except socket.timeout:
                alive += 1  # still open, nothing to read
            except OSError:
                pass
        check(alive <= 16, "%d slow connections from one address held open" % alive)
    finally:
        for c in slow:
            c.close()

    # Signed mutations may have settled `a` already: a fresh attempt.
    b = api.insert_attempt(s, "UNKNOWN", ppid="pi_fuzz_real_0002")
    st, doc = api.post_webhook(port, api.event("succeeded", b))
    check_eq((st, doc["result"]), (200, "applied"), "a real delivery after the fuzzing")
    check_eq(api.counts(s, b["id"])["status"], "SUCCEEDED", "the real event's attempt")
    check_eq(api.stop_api(s, name), 0, "api exit status on SIGTERM")


if __name__ == "__main__":
    raise SystemExit(e2e.main(scenario))
