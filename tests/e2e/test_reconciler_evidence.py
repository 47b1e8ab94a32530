#!/usr/bin/env python3
"""Regression scenarios (each failed against the reconciler and resolve
before "Reconciler: book only the attempt's own intent, never FAIL on
foreign or garbled evidence"): an outside attack showed the reconciler
settling on an intent that was not the attempt's own, FAILING an attempt
on an answer that was no search result, missing a second paid intent, two
operators booking one intent twice, and schedules the database cannot add
to now(). docs/reconciler.md, "The order of evidence".

A small proxy in front of psp-sim (ProviderProxy) lets a scenario hold
look-ups or replace their answers, as a lagging or misbehaving provider
would; psp-sim itself still charges, and its ledger is the truth.

Since issue 34 a search only finds what names the attempt (metadata is
anyone's to write): inside the key's window the reconciler never searches,
it charges again under the attempt's key, and settles only on that answer.

1. declined_other_amount: a declined intent for another amount names the
   attempt, while the attempt's own key charged but is not in the search
   yet (the proxy leaves it out, as a lagging search does) -> never FAILED:
   the replay under the key settles it SUCCEEDED on its own intent, nothing
   booked on the foreign one, no search made.
2. other_currency: nothing executed under the key (error_before), a
   succeeded intent in another currency names the attempt -> never settled
   on it: the attempt stays UNKNOWN while the charges again fail.
   other_attempt / no_amount: the search would garble the attempt's own
   intent (naming another attempt, without an amount) -> it is never asked:
   the replay settles SUCCEEDED.
3. list_empty: the search answers 200 {"object":"list","data":[]}, past the
   key's retention and the search lag -> no evidence: the attempt stays
   UNKNOWN (never FAILED) while reconcile_checks grows; the real search then
   finds the intent, which past the window only names the attempt:
   REQUIRES_REVIEW (unproven), nothing booked.
4. second_paid_intent: the intent id is known (pm_card_processing, settled
   succeeded later) and a second, foreign succeeded intent names the
   attempt -> ours settles SUCCEEDED, the foreign one is noted in the
   look's evidence, never booked.
5. resolve_race: two operators resolve two attempts with one intent at once
   (both with --force: it only names one of them), look-ups held 1.5 s ->
   one ledger row for the intent
   (the unique index), the other resolve exits non-zero and writes nothing.
6. schedule_overflow: RECONCILER_SCHEDULE_MS 10000000000000000,
   99999999999999999999, " 5" and "5," -> the reconciler refuses to start:
   exit 2, one line naming RECONCILER_SCHEDULE_MS.

Scenarios can be run alone: test_reconciler_evidence.py list_empty"""
import http.client
import json
import signal
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
import uuid
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import charged_e2e as e2e
from charged_e2e import check, check_eq

WORKER = {"WORKER_UNKNOWN_RETRIES": 0, "RECONCILER_FIRST_LOOK_MS": 0,
          "PROVIDER_TIMEOUT_MS": 1000, "WORKER_LEASE_MS": 5000}
RECONCILER = {"RECONCILER_SCHEDULE_MS": 200, "RECONCILER_POLL_MS": 100,
              "PROVIDER_TIMEOUT_MS": 1000}
OPEN = ("UNKNOWN", "PROCESSING")


# ---- a provider in front of psp-sim ----

class ProviderProxy:
    """Listens on a port of its own and passes every request on to psp-sim's
    provider API. GETs wait `hold_gets` seconds first; `rewrite(method, path,
    status, body)` may return (status, body) to answer instead of psp-sim
    (None: psp-sim's answer). `rewritten` counts the answers replaced."""

    def __init__(self, upstream_port, rewrite=None, hold_gets=0.0):
        self.upstream_port = upstream_port
        self.rewrite = rewrite
        self.hold_gets = hold_gets
        self.rewritten = 0
        self._lock = threading.Lock()
        proxy = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args):
                pass

            def forward(self):
                length = int(self.headers.get("Content-Length") or 0)
                body = self.rfile.read(length) if length else None
                headers = {k: v for k, v in self.headers.items()
                           if k.lower() not in ("host", "content-length", "connection")}
                if self.command == "GET" and proxy.hold_gets:
                    time.sleep(proxy.hold_gets)
                up = http.client.HTTPConnection("127.0.0.1", proxy.upstream_port, timeout=60)
                try:
                    up.request(self.command, self.path, body=body, headers=headers)
                    answer = up.getresponse()
                    status, data = answer.status, answer.read()
                    replayed = answer.getheader("Idempotent-Replayed")
                finally:
                    up.close()
                if proxy.rewrite:
                    instead = proxy.rewrite(self.command, self.path, status, data)
                    if instead is not None:
                        status, data = instead
                        with proxy._lock:
                            proxy.rewritten += 1
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                if replayed:
                    self.send_header("Idempotent-Replayed", replayed)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            do_GET = do_POST = forward

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.port = self.server.server_address[1]
        self.url = "http://127.0.0.1:%d" % self.port
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        PROXIES.append(self)

    def close(self):
        self.server.shutdown()
        self.server.server_close()


PROXIES = []


def rewrite_search(edit):
    """A rewrite for ProviderProxy: psp-sim's search answers (200) go through
    edit(doc), which returns the document to answer instead."""
    def rewrite(method, path, status, body):
        if method != "GET" or not path.startswith("/v1/payment_intents/search") or status != 200:
            return None
        return 200, json.dumps(edit(json.loads(body))).encode()
    return rewrite


# ---- what the database and psp-sim say about one attempt ----

def attempt(s, aid):
    rows = s.query("SELECT status, coalesce(reason, ''), coalesce(provider_payment_id, ''), "
                   "reconcile_checks, coalesce(lease_owner, '') "
                   "FROM payment_attempts WHERE id = '%s'" % aid)
    check(len(rows) == 1, "want one row for attempt %s: %s" % (aid, rows))
    r = rows[0]
    return {"status": r[0], "reason": r[1], "ppid": r[2], "checks": int(r[3]),
            "lease_owner": r[4]}


def transitions(s, aid, cause):
    return [tuple(r) for r in s.query(
        "SELECT coalesce(old_status, ''), new_status, coalesce(actor, '') "
        "FROM attempt_transitions WHERE payment_attempt_id = '%s' AND cause = '%s' "
        "ORDER BY id" % (aid, cause))]


def calls(s, aid, actor):
    """[(operation, outcome, http_status or '')] of one actor, in order."""
    return [tuple(r) for r in s.query(
        "SELECT operation, outcome, coalesce(http_status::text, '') FROM provider_calls "
        "WHERE payment_attempt_id = '%s' AND actor = '%s' ORDER BY id" % (aid, actor))]


def ledger_entries(s, aid):
    return s.query("SELECT kind, amount, provider_payment_id FROM ledger_entries "
                   "WHERE payment_attempt_id = '%s'" % aid)


def booked(s, intent):
    """Attempts a ledger row books the intent for."""
    return [r[0] for r in s.query("SELECT payment_attempt_id FROM ledger_entries "
                                  "WHERE provider_payment_id = '%s'" % intent)]


def charges_of_key(s, key):
    return [c for c in s.ledger() if c["idempotency_key"] == key]


def describe(s, aid):
    return "attempt %s; reconciler transitions %s; ledger_entries %s" % (
        attempt(s, aid), transitions(s, aid, "reconciler"), ledger_entries(s, aid))


def wait_status(s, aid, statuses, timeout, stays):
    """Until the attempt is in one of statuses; Failure at once if it enters
    a status outside statuses + stays."""
    def cond():
        a = attempt(s, aid)
        if a["status"] not in tuple(statuses) + tuple(stays):
            raise e2e.Failure("attempt went %s, want %s: %s" % (
                a["status"], statuses, describe(s, aid)))
        return a if a["status"] in statuses else None
    return e2e.wait_until("attempt %s in %s" % (aid, statuses), cond, timeout, 0.1)


def worker_leaves(s, cmd, want="UNKNOWN", **env):
    s.start_worker(**dict(WORKER, **env))
    s.publish([cmd])
    s.wait_settled(1, timeout=60)
    a = attempt(s, cmd["payment_attempt_id"])
    check(a["status"] == want, lambda: "the worker was to leave the attempt %s: %s" % (
        want, describe(s, cmd["payment_attempt_id"])))
    return a


def psp_charge(s, cmd, amount=None, currency="eur", payment_method="pm_card_visa"):
    """A charge straight to psp-sim under a key of its own, its metadata
    naming cmd's attempt (as another client would); returns the intent (a
    declined one comes inside the 402)."""
    form = {"amount": str(cmd["amount"] if amount is None else amount),
            "currency": currency, "payment_method": payment_method, "confirm": "true",
            "off_session": "true", "metadata[payment_attempt_id]": cmd["payment_attempt_id"],
            "metadata[order_id]": cmd["order_id"]}
    req = urllib.request.Request(
        "http://127.0.0.1:%d/v1/payment_intents" % s.psp_port,
        data=urllib.parse.urlencode(form).encode(), method="POST",
        headers={"Authorization": "Bearer " + e2e.API_KEY,
                 "Idempotency-Key": "other:" + str(uuid.uuid4()),
                 "Content-Type": "application/x-www-form-urlencoded"})
    try:
        with urllib.request.urlopen(req, timeout=30) as r:
            return json.load(r)
    except urllib.error.HTTPError as e:
        doc = json.load(e)
        check(e.code == 402 and "payment_intent" in doc.get("error", {}),
              "psp-sim answered the set-up charge %d: %s" % (e.code, doc))
        return doc["error"]["payment_intent"]


def check_review_on_nothing(s, aid, old, why, foreign=()):
    """REQUIRES_REVIEW by the reconciler, contradictory for `why`, nothing
    booked: no ledger row for the attempt, none for the foreign intents,
    and no foreign intent recorded on the attempt."""
    a = attempt(s, aid)
    check_eq(a["status"], "REQUIRES_REVIEW", "status of %s" % aid)
    check("contradictory" in a["reason"] and why in a["reason"],
          "reason %r does not say contradictory: %s" % (a["reason"], why))
    check_eq([t[:2] for t in transitions(s, aid, "reconciler")], [(old, "REQUIRES_REVIEW")],
             "reconciler transitions of %s" % aid)
    check_eq(ledger_entries(s, aid), [], "ledger_entries of %s" % aid)
    for intent in foreign:
        check_eq(booked(s, intent), [], "ledger rows booking foreign intent %s" % intent)
        check(a["ppid"] != intent, "foreign intent %s recorded on the attempt: %s" % (intent, a))
    e2e.log("REQUIRES_REVIEW:", repr(a["reason"]))
    return a


# ---- the scenarios ----

def declined_other_amount(new):
    cmd = e2e.new_command()
    aid, key = cmd["payment_attempt_id"], cmd["idempotency_key"]
    s = new("ev_declined", psp_args=["--fault", "error_after=1@%s#1" % key])
    foreign = psp_charge(s, cmd, amount=cmd["amount"] + 1,
                         payment_method="pm_card_chargeDeclined")
    check_eq(foreign["status"], "requires_payment_method", "the foreign intent's status")
    worker_leaves(s, cmd)
    own = charges_of_key(s, key)
    check_eq([c["outcome"] for c in own], ["succeeded"], "psp-sim charges of the attempt's key")
    own_id = own[0]["payment_intent_id"]

    def lagging(doc):  # the attempt's own intent is not indexed yet
        doc["data"] = [pi for pi in doc["data"] if pi["id"] != own_id]
        return doc
    px = ProviderProxy(s.psp_port, rewrite=rewrite_search(lagging))
    r = s.start_reconciler(PROVIDER_BASE_URL=px.url, **RECONCILER)  # search lag: 60 s default
    a = wait_status(s, aid, ["SUCCEEDED"], 30, stays=["UNKNOWN"])
    check_eq(a["ppid"], own_id, "the intent settled on (the replay under the key)")
    check_eq(booked(s, foreign["id"]), [], "ledger rows booking the foreign intent")
    check_eq([c[0] for c in calls(s, aid, s.worker_ids[r])], ["charge"],
             "the reconciler's calls (the replay, no search)")
    check_eq(len(charges_of_key(s, key)), 1, "psp-sim charges of the attempt's key")
    s.check_invariants()


def other_currency(new):
    cmd = e2e.new_command()
    aid, key = cmd["payment_attempt_id"], cmd["idempotency_key"]
    s = new("ev_currency", psp_args=["--fault", "error_before=1@%s" % key])
    worker_leaves(s, cmd)  # nothing executed for the key
    usd = psp_charge(s, cmd, currency="usd")
    check_eq(usd["status"], "succeeded", "the USD intent's status")
    r = s.start_reconciler(**RECONCILER)

    def looked_twice():
        a = attempt(s, aid)
        check(a["status"] == "UNKNOWN", lambda: "on a foreign intent the attempt went %s: %s"
              % (a["status"], describe(s, aid)))
        return a["checks"] >= 2
    e2e.wait_until("2 looks", looked_twice, 30, 0.1)
    check_eq(s.stop_reconciler(r), 0, "exit status of the reconciler after SIGTERM")
    check_eq(booked(s, usd["id"]), [], "ledger rows booking the foreign intent")
    check_eq(attempt(s, aid)["ppid"], "", "the intent recorded on the attempt")
    check_eq({c[0] for c in calls(s, aid, s.worker_ids[r])}, {"charge"},
             "the reconciler's calls (charges again under the key, no search)")
    check_eq(charges_of_key(s, key), [], "psp-sim charges of the attempt's key")


def rewritten_search(new, name, edit, why):
    """The attempt's own key charged (its answer lost); the search finds that
    intent, but edit() garbles what it says of it."""
    cmd = e2e.new_command()
    aid, key = cmd["payment_attempt_id"], cmd["idempotency_key"]
    s = new(name, psp_args=["--fault", "error_after=1@%s#1" % key])
    worker_leaves(s, cmd)
    own = charges_of_key(s, key)
    check_eq([c["outcome"] for c in own], ["succeeded"], "psp-sim charges of the attempt's key")

    def each_intent(doc):
        for pi in doc["data"]:
            edit(pi)
        return doc
    px = ProviderProxy(s.psp_port, rewrite=rewrite_search(each_intent))
    r = s.start_reconciler(PROVIDER_BASE_URL=px.url, **RECONCILER)
    a = wait_status(s, aid, ["SUCCEEDED"], 30, stays=["UNKNOWN"])
    check_eq(px.rewritten, 0, "search answers rewritten (no search is made)")
    check_eq(a["ppid"], own[0]["payment_intent_id"], "the intent settled on (%s)" % why)
    check_eq([c[0] for c in calls(s, aid, s.worker_ids[r])], ["charge"],
             "the reconciler's calls")
    check_eq(len(charges_of_key(s, key)), 1, "psp-sim charges of the attempt's key")
    s.check_invariants()


def other_attempt(new):
    def name_another(pi):
        pi["metadata"]["payment_attempt_id"] = str(uuid.uuid4())
    rewritten_search(new, "ev_other_attempt", name_another, "another attempt")


def no_amount(new):
    def drop_amount(pi):
        del pi["amount"]
    rewritten_search(new, "ev_no_amount", drop_amount, "without amount")


def list_empty(new):
    retention, lag = 3000, 1000
    cmd = e2e.new_command()
    aid, key = cmd["payment_attempt_id"], cmd["idempotency_key"]
    s = new("ev_list_empty", psp_args=["--key-retention-ms", str(retention),
                                       "--fault", "error_after=1@%s#1" % key])
    worker_leaves(s, cmd, WORKER_KEY_RETENTION_MS=retention)
    check_eq(len(charges_of_key(s, key)), 1, "psp-sim charges of the attempt's key")

    def age_ms():
        return float(s.query("SELECT extract(epoch FROM now() - first_sent_at) * 1000 "
                             "FROM payment_attempts WHERE id = '%s'" % aid)[0][0])
    # Past the retention and the lag from the first look on: no charge may
    # be sent, and "not found" would be FAILED never_executed.
    e2e.wait_until("the key's retention and the search lag to pass",
                   lambda: age_ms() >= retention + lag + 300, 15, 0.1)
    not_a_result = json.dumps({"object": "list", "data": [], "has_more": False}).encode()

    def rewrite(method, path, status, body):
        if method == "GET" and path.startswith("/v1/payment_intents/search"):
            return 200, not_a_result
        return None
    px = ProviderProxy(s.psp_port, rewrite=rewrite)
    env = dict(RECONCILER, WORKER_KEY_RETENTION_MS=retention, RECONCILER_SEARCH_LAG_MS=lag)
    r = s.start_reconciler(PROVIDER_BASE_URL=px.url, **env)

    def looked_thrice():
        a = attempt(s, aid)
        check(a["status"] == "UNKNOWN", lambda: "on a 200 that is no search result the "
              "attempt went %s: %s" % (a["status"], describe(s, aid)))
        return a["checks"] >= 3
    e2e.wait_until("3 looks answered with a bare list", looked_thrice, 30, 0.1)
    check_eq(s.stop_reconciler(r), 0, "exit status of the reconciler after SIGTERM")
    rc = calls(s, aid, s.worker_ids[r])
    check(len(rc) >= 3 and all(c[0] == "search" and c[2] == "200" for c in rc),
          "want only searches answered 200 (no charge past the retention): %s" % rc)
    check(all(c[1] != "not_found" for c in rc),
          "a bare list was recorded as not found: %s" % rc)
    a = attempt(s, aid)
    check_eq((a["status"], transitions(s, aid, "reconciler")), ("UNKNOWN", []),
             "status and reconciler transitions after the bare lists")
    e2e.log("list_empty: %d looks, the attempt stayed UNKNOWN; calls %s" % (a["checks"], rc[:2]))
    # The provider's real search then finds the charge it made: past the
    # key's window it only names the attempt, a person decides.
    s.start_reconciler(**env)
    a = wait_status(s, aid, ["REQUIRES_REVIEW"], 30, stays=["UNKNOWN"])
    charges = charges_of_key(s, key)
    check_eq(len(charges), 1, "psp-sim charges of the attempt's key")
    check("unproven" in a["reason"] and charges[0]["payment_intent_id"] in a["reason"],
          "reason %r" % a["reason"])
    check_eq(ledger_entries(s, aid), [], "ledger_entries of %s" % aid)
    s.check_invariants()


def second_paid_intent(new):
    cmd = e2e.new_command(payment_method="pm_card_processing")
    aid = cmd["payment_attempt_id"]
    s = new("ev_second_intent")
    a = worker_leaves(s, cmd, want="PROCESSING")
    own = a["ppid"]
    check(own, "the worker stored no intent id for the processing attempt: %s" % a)
    second = psp_charge(s, cmd)
    check_eq(second["status"], "succeeded", "the second intent's status")
    s.psp_put("/intents/%s/settle" % own, {"status": "succeeded"}, method="POST")
    paid = [c["payment_intent_id"] for c in s.ledger()
            if c["payment_attempt_id"] == aid and c["outcome"] == "succeeded"]
    check_eq(sorted(paid), sorted([own, second["id"]]), "succeeded intents at psp-sim")
    r = s.start_reconciler(**RECONCILER)
    a = wait_status(s, aid, ["SUCCEEDED"], 30, stays=["PROCESSING"])
    check_eq(a["ppid"], own, "the intent settled on (its recorded id)")
    check_eq(booked(s, second["id"]), [], "ledger rows booking the foreign intent")
    evidence = s.query("SELECT evidence->>'foreign' FROM attempt_transitions WHERE"
                       " payment_attempt_id = '%s' AND cause = 'reconciler'" % aid)
    check(evidence and evidence[0][0] and "foreign" in evidence[0][0],
          "the foreign intent is not in the look's evidence: %s" % evidence)
    check_eq([c[0] for c in calls(s, aid, s.worker_ids[r])], ["retrieve", "search"],
             "the reconciler's calls (a succeeded retrieve, then a search)")
    s.check_invariants()


def resolve_race(new):
    # resolve trusts psp-sim's search at once (its lag is 0 here).
    s = new("ev_resolve_race", worker_env={"RECONCILER_SEARCH_LAG_MS": "0"})
    s.start_worker()
    # Two attempts in review: each key was used at psp-sim first with other
    # parameters (by the test), so the worker's charge is refused 400.
    a_cmd, b_cmd = e2e.new_command(amount=1500), e2e.new_command(amount=1500)
    intents = {}
    for cmd, pm in ((a_cmd, "pm_card_visa"), (b_cmd, "pm_card_chargeDeclined")):
        form = {"amount": "1500", "currency": "eur", "payment_method": pm, "confirm": "true",
                "metadata[payment_attempt_id]": cmd["payment_attempt_id"],
                "metadata[order_id]": cmd["order_id"]}
        req = urllib.request.Request(
            "http://127.0.0.1:%d/v1/payment_intents" % s.psp_port,
            data=urllib.parse.urlencode(form).encode(), method="POST",
            headers={"Authorization": "Bearer " + e2e.API_KEY,
                     "Idempotency-Key": cmd["idempotency_key"],
                     "Content-Type": "application/x-www-form-urlencoded"})
        try:
            with urllib.request.urlopen(req, timeout=30) as resp:
                intents[pm] = json.load(resp)
        except urllib.error.HTTPError as e:
            intents[pm] = json.load(e)["error"]["payment_intent"]
    s.publish([a_cmd, b_cmd])
    for cmd in (a_cmd, b_cmd):
        e2e.wait_until("attempt %s in REQUIRES_REVIEW" % cmd["payment_attempt_id"],
                       lambda: s.query("SELECT 1 FROM payment_attempts WHERE id = '%s' AND "
                                       "status = 'REQUIRES_REVIEW'" % cmd["payment_attempt_id"]),
                       60)
    pi = intents["pm_card_visa"]["id"]  # A's, succeeded
    # Look-ups held 1.5 s: both operators read "not booked elsewhere" before
    # either writes. Both force: the intent only names A (A's own call
    # under its key was refused), so unforced it is refused before any
    # write, and nothing would race.
    px = ProviderProxy(s.psp_port, hold_gets=1.5)
    env = s.env({"PROVIDER_BASE_URL": px.url, "PROVIDER_TIMEOUT_MS": "5000"})
    procs = {
        "alice": subprocess.Popen([e2e.CHARGECTL, "attempt", "resolve", a_cmd["payment_attempt_id"],
                                   "--succeeded", pi, "--force", "--actor", "alice"], env=env,
                                  stdout=subprocess.PIPE, stderr=subprocess.PIPE),
        "bob": subprocess.Popen([e2e.CHARGECTL, "attempt", "resolve", b_cmd["payment_attempt_id"],
                                 "--succeeded", pi, "--force", "--actor", "bob"], env=env,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE),
    }
    out = {}
    for who, p in procs.items():
        try:
            o, e = p.communicate(timeout=e2e.scaled(60))
        except subprocess.TimeoutExpired:
            p.kill()
            p.communicate()
            raise e2e.Failure("resolve by %s did not finish" % who)
        out[who] = (p.returncode, e.decode().strip())
        e2e.log("resolve by %s: exit %d %r" % (who, p.returncode, out[who][1][-300:]))
    attempt_of = {"alice": a_cmd["payment_attempt_id"], "bob": b_cmd["payment_attempt_id"]}
    rows = booked(s, pi)
    check(len(rows) <= 1, "intent %s booked for %d attempts: %s; resolves %s"
          % (pi, len(rows), rows, out))
    winners = [w for w in out if out[w][0] == 0]
    check(len(winners) == 1, "want exactly one resolve to exit 0: %s" % out)
    winner, loser = winners[0], [w for w in out if w != winners[0]][0]
    check_eq(rows, [attempt_of[winner]], "attempts the ledger books %s for" % pi)
    check_eq(attempt(s, attempt_of[winner])["status"], "SUCCEEDED", "the winner's attempt")
    lost = attempt(s, attempt_of[loser])
    check_eq((lost["status"], transitions(s, attempt_of[loser], "operator"),
              ledger_entries(s, attempt_of[loser])), ("REQUIRES_REVIEW", [], []),
             "the loser's attempt (status, operator transitions, ledger rows)")
    check(out[loser][1] and "\n" not in out[loser][1],
          "want one line on the loser's stderr: %r" % out[loser][1])
    e2e.log("resolve race: %s booked %s, %s refused: %r" % (winner, pi, loser, out[loser][1]))


def schedule_overflow(new):
    s = new("ev_schedule")
    for value in ("10000000000000000", "99999999999999999999", " 5", "5,"):
        env = s.env({"RECONCILER_SCHEDULE_MS": value, "WORKER_ID": "sched-" + uuid.uuid4().hex[:6]})
        p = subprocess.Popen([e2e.CHARGED, "reconciler"], env=env,
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        try:
            o, e = p.communicate(timeout=e2e.scaled(5))
        except subprocess.TimeoutExpired:
            p.send_signal(signal.SIGKILL)
            p.communicate()
            raise e2e.Failure("the reconciler started with RECONCILER_SCHEDULE_MS=%r "
                              "(still running 5 s later; killed it)" % value)
        err = e.decode().strip()
        check(p.returncode == 2 and err and "\n" not in err
              and "RECONCILER_SCHEDULE_MS" in err,
              "RECONCILER_SCHEDULE_MS=%r: exit %d, want 2 with one line naming it; "
              "stdout %r stderr %r" % (value, p.returncode, o.decode(), err))
        e2e.log("RECONCILER_SCHEDULE_MS=%r refused: %r" % (value, err))
    # A year is the most a look may wait: accepted.
    r = s.start_reconciler(RECONCILER_SCHEDULE_MS="200,31536000000")
    time.sleep(1)
    check(s.reconcilers[r].poll() is None,
          "the reconciler exited %s with RECONCILER_SCHEDULE_MS=200,31536000000"
          % s.reconcilers[r].poll())
    check_eq(s.stop_reconciler(r), 0, "exit status of the reconciler after SIGTERM")


SCENARIOS = [declined_other_amount, other_currency, other_attempt, no_amount, list_empty,
             second_paid_intent, resolve_race, schedule_overflow]


def scenario(new):
    """Every scenario, or those named on the command line."""
    wanted = sys.argv[1:]
    unknown = [w for w in wanted if w not in [f.__name__ for f in SCENARIOS]]
    check(not unknown, "no such scenario: %s (have %s)" % (
        unknown, [f.__name__ for f in SCENARIOS]))
    made = []

    def tracked(*a, **k):
        s = new(*a, **k)
        made.append(s)
        return s
    for fn in [f for f in SCENARIOS if not wanted or f.__name__ in wanted]:
        t0 = time.monotonic()
        e2e.log("----", fn.__name__)
        fn(tracked)
        e2e.log("----", fn.__name__, "passed in %.1fs" % (time.monotonic() - t0))
        while made:  # free its processes now; e2e.main closes the rest on failure
            made.pop().close()
        while PROXIES:
            PROXIES.pop().close()


if __name__ == "__main__":
    raise SystemExit(e2e.main(scenario))
