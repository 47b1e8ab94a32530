"""`charged console` in end-to-end scenarios: starting it, making tokens
with chargectl, and a client that signs in the way the page does (the
session cookie, the CSRF token from the sign-in answer). Python standard
library only."""

import json
import os
import subprocess
import uuid

import charged_api as api
import charged_e2e as e2e
from charged_e2e import check


CARD = "4242424242424242"


def start_console(s, **extra_env):
    """`charged console` for scenario s on a free loopback port; returns
    (name, port) once it answers. Kept among s.apis, so s.close() stops it.
    A port another process took between free_port() and the console's
    bind (tests run side by side) is tried again with another, twice."""
    for attempt in range(3):
        s.worker_seq += 1
        name = "console%d" % s.worker_seq
        port = e2e.free_port()
        env = s.env({"CONSOLE_ADDR": "127.0.0.1:%d" % port,
                     "CONSOLE_THREADS": "4",
                     "WORKER_ID": "%s-%s" % (name, uuid.uuid4().hex[:6]),
                     "CONSOLE_WORKER_GROUP": s.group})
        env.update({k: str(v) for k, v in extra_env.items()})
        out = open(os.path.join(s.dir, name + ".log"), "ab")
        p = subprocess.Popen([e2e.CHARGED, "console"], stdout=out, stderr=out, env=env)
        s.apis[name] = p

        def up():
            if p.poll() is not None:
                return "exited"
            try:
                return request(port, "GET", "/console/api/session")[0] == 401
            except OSError:
                return False
        state = e2e.wait_until("charged console listening", up, 20)
        if state is True:
            e2e.log("started console", name, "pid", p.pid, "port", port)
            return name, port
        with open(out.name, "rb") as f:
            taken = b"Address already in use" in f.read()
        if not taken or attempt == 2:
            raise e2e.Failure("charged console exited %d at start; see %s"
                              % (p.returncode, out.name))
        e2e.log("console port %d taken before its bind; another" % port)


def token(s, name, role, actor="e2e-admin"):
    """chargectl console token add NAME --role ROLE: the secret it shows once."""
    p = s.run([e2e.CHARGECTL, "console", "token", "add", name, "--role", role,
               "--actor", actor, "--json"])
    return json.loads(p.stdout.decode())["secret"]


def revoke(s, name, actor="e2e-admin"):
    s.run([e2e.CHARGECTL, "console", "token", "revoke", name, "--actor", actor])


def request(port, method, path, body=None, headers=None, timeout=60, source=None):
    """(status, parsed JSON or None, headers, raw bytes); source: the
    loopback address to send from, as another client host would."""
    return api.request_with_headers(port, method, path, body, headers, timeout, source)


class Client:
    """One signed-in operator, as the page is: the cookie and the CSRF token."""

    def __init__(self, port, secret=None, source=None):
        self.port = port
        self.source = source
        self.cookie = None
        self.csrf = None
        self.who = None
        if secret is not None:
            st, doc = self.login(secret)
            check(st == 200, "sign-in refused: %s %s" % (st, doc))

    def login(self, secret):
        st, doc, headers, _ = request(self.port, "POST", "/console/api/login",
                                      json.dumps({"token": secret}),
                                      {"Content-Type": "application/json"},
                                      source=self.source)
        if st == 200:
            cookie = headers.get("Set-Cookie", "")
            self.cookie = cookie.split(";", 1)[0]
            self.csrf = doc["csrf_token"]
            self.who = doc
        return st, doc

    def headers(self, csrf=True, extra=None):
        h = {"Content-Type": "application/json"}
        if self.cookie:
            h["Cookie"] = self.cookie
        if csrf and self.csrf:
            h["X-CSRF-Token"] = self.csrf
        h.update(extra or {})
        return h

    def get(self, path):
        st, doc, _, _ = request(self.port, "GET", "/console/api/" + path,
                                headers=self.headers(csrf=False), source=self.source)
        return st, doc

    def post(self, path, body, csrf=True, extra=None):
        data = body if isinstance(body, (bytes, str)) else json.dumps(body)
        st, doc, _, _ = request(self.port, "POST", "/console/api/" + path, data,
                                self.headers(csrf, extra), source=self.source)
        return st, doc


def hostile_letter(s, card=CARD):
    """A dead letter, written straight into the scenario's DLQ topic as an
    older producer could have left it: its key, value and headers hold
    markup and a card number that nothing masked on the way. Returns what
    was written."""
    mark = "<script>window.__pwned=1</script>\"><img src=x onerror=\"window.__pwned=2\">"
    value = json.dumps({"payment_attempt_id": str(uuid.uuid4()), "note": mark,
                        "card": card})
    rec = {"key": "key " + mark + " " + card, "value": value,
           "headers": [["dlq.reason", "schema_violation"],
                       ["dlq.error", "bad field " + mark + " card " + card],
                       ["dlq.failed_at", "2026-12-01T10:00:00.000Z"],
                       ["dlq.original.topic", s.topics["commands"]],
                       ["dlq.original.partition", "0"], ["dlq.original.offset", "7"],
                       ["x-note", mark + card]]}
    s.tool("produce", s.topics["dlq"], stdin=(json.dumps(rec) + "\n").encode())
    return rec


def replayable_letter(s, cmd):
    """A dead letter of a valid command (as a database outage could have
    left one), to be replayed."""
    rec = {"key": cmd["payment_attempt_id"], "value": json.dumps(cmd),
           "headers": [["dlq.reason", "database_refused"],
                       ["dlq.error", "the database refused the attempt"],
                       ["dlq.failed_at", "2026-12-01T11:00:00.000Z"],
                       ["dlq.original.topic", s.topics["commands"]],
                       ["dlq.original.partition", "1"], ["dlq.original.offset", "9"]]}
    s.tool("produce", s.topics["dlq"], stdin=(json.dumps(rec) + "\n").encode())
    return rec


def letter_positions(client):
    """Position of every dead letter the console lists, by its reason."""
    st, doc = client.get("dead-letters?limit=1000")
    check(st == 200, "dead letters: %s %s" % (st, doc))
    return [(l["position"], l.get("reason")) for l in doc["letters"]]
