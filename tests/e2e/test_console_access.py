#!/usr/bin/env python3
"""charged console's doors, against real PostgreSQL, Kafka, psp-sim and a
worker, over plain HTTP as any client could send it.

Covered: every endpoint answers 401 without a session (and with a forged
or expired cookie); a viewer reads but every action is 403; an action
without the session's CSRF token, with a wrong one, from another origin or
not as JSON is 403 and writes nothing; a revoked token's session is refused
by the very next request; two operators resolving one review at once give
one resolution and one 409 conflict; the provider's objection is 422 and
force needs the attempt id repeated; every action is in console_actions
with its actor; a hostile dead letter comes back as JSON text with its card
number masked; the page's CSP allows no inline script; and the JSON
endpoints under random input answer 4xx, never 5xx, and the console lives
on. FUZZ_SEED reproduces the random part."""

import json
import os
import random
import re
import threading
import time
import uuid

import charged_console as con
import charged_e2e as e2e
from charged_e2e import check, check_eq
from test_chargectl_resolve import into_review, status

CARD = con.CARD
ENDPOINTS = [("GET", "session"), ("GET", "overview"), ("GET", "reviews"),
             ("GET", "attempts?id=" + str(uuid.uuid4())),
             ("GET", "attempts/" + str(uuid.uuid4())), ("GET", "dead-letters"),
             ("GET", "dead-letters/0:0"), ("GET", "actions"),
             ("POST", "attempts/%s/resolve" % uuid.uuid4()), ("POST", "dead-letters/replay"),
             ("POST", "steps/void/%s/resolve" % uuid.uuid4()), ("POST", "logout")]


def operator_transitions(s, attempt_id):
    return s.query("SELECT actor FROM attempt_transitions WHERE payment_attempt_id = '%s'"
                   " AND cause = 'operator'" % attempt_id)


def no_session(port):
    anon = con.Client(port)
    for method, path in ENDPOINTS:
        st, doc = anon.get(path) if method == "GET" else anon.post(path, {})
        check_eq(st, 401, "%s %s without a session" % (method, path))
        check("error" in (doc or {}), "%s %s: 401 without an error text" % (method, path))
    forged = con.Client(port)
    forged.cookie = "charged_console=" + "A" * 43
    check_eq(forged.get("overview")[0], 401, "a forged session cookie")
    check_eq(con.Client(port).login("cct_" + "x" * 43)[0], 401, "an unknown token")
    check_eq(con.Client(port).login("not a token")[0], 400, "a malformed token")
    st, _, _, _ = con.request(port, "POST", "/console/api/login", "{", {"Content-Type": "application/json"})
    check_eq(st, 400, "a sign-in body that is not JSON")


def viewer_reads_only(s, port, review):
    secret = con.token(s, "victor", "viewer")
    v = con.Client(port, secret)
    check_eq(v.who["role"], "viewer", "the viewer's role")
    for path in ("overview", "reviews", "dead-letters", "actions"):
        check_eq(v.get(path)[0], 200, "a viewer's GET %s" % path)
    st, doc = v.post("attempts/%s/resolve" % review["payment_attempt_id"],
                     {"decision": "failed", "reason": "viewer tries"})
    check_eq(st, 403, "a viewer's resolve")
    st, _ = v.post("steps/capture/%s/resolve" % uuid.uuid4(),
                   {"decision": "failed", "reason": "viewer tries"})
    check_eq(st, 403, "a viewer's resolve of a capture")
    st, _ = v.post("dead-letters/replay", {"positions": ["0:0"], "dry_run": False})
    check_eq(st, 403, "a viewer's replay")
    check_eq(operator_transitions(s, review["payment_attempt_id"]), [],
             "operator transitions after a viewer's attempt")


def csrf_required(s, port, review, op):
    path = "attempts/%s/resolve" % review["payment_attempt_id"]
    body = {"decision": "failed", "reason": "no csrf"}
    check_eq(op.post(path, body, csrf=False)[0], 403, "resolve without the CSRF token")
    check_eq(op.post(path, body, extra={"X-CSRF-Token": "A" * 43})[0], 403,
             "resolve with another CSRF token")
    check_eq(op.post(path, body, extra={"Origin": "http://evil.example"})[0], 403,
             "resolve from another origin")
    check_eq(op.post(path, body, extra={"Content-Type": "text/plain"})[0], 403,
             "resolve sent as a form would be")
    check_eq(op.post("dead-letters/replay", {"positions": ["0:0"], "dry_run": False},
                     csrf=False)[0], 403, "replay without the CSRF token")
    check_eq(operator_transitions(s, review["payment_attempt_id"]), [],
             "operator transitions after requests without CSRF")


def revoked_at_once(s, port):
    secret = con.token(s, "temp", "operator")
    c = con.Client(port, secret)
    check_eq(c.get("session")[0], 200, "a fresh session")
    con.revoke(s, "temp")
    st, doc = c.get("session")
    check_eq(st, 401, "the very next request of a revoked token's session")
    check_eq(con.Client(port).login(secret)[0], 401, "sign-in with a revoked token")


def race(s, port, alice, bob):
    """Two operators resolve one review at the same moment. The intent was
    made under the attempt's key by a request the worker's own call was
    refused for: it only names the attempt, so each books it on their word
    (force, confirmed)."""
    cmd, pi = into_review(s, "pm_card_mastercard")
    st, doc = alice.post("attempts/%s/resolve" % cmd["payment_attempt_id"],
                         {"decision": "succeeded", "payment_intent_id": pi["id"]})
    check_eq((st, doc.get("verdict"), doc.get("can_force")), (422, "unproven", True),
             "an unforced resolve with an intent that only names the attempt: %s" % doc)
    check("not proven" in doc.get("error", ""), "the refusal says why: %s" % doc)
    barrier = threading.Barrier(2)
    results = {}

    def go(name, client):
        barrier.wait()
        results[name] = client.post("attempts/%s/resolve" % cmd["payment_attempt_id"],
                                    {"decision": "succeeded", "payment_intent_id": pi["id"],
                                     "reason": "paid by " + name, "force": True,
                                     "confirm": cmd["payment_attempt_id"]})
    threads = [threading.Thread(target=go, args=(n, c)) for n, c in (("olivia", alice), ("oscar", bob))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    codes = sorted(r[0] for r in results.values())
    check_eq(codes, [200, 409], "two resolutions at once: %s" % results)
    loser = [r[1] for r in results.values() if r[0] == 409][0]
    check(loser.get("error"), "the 409 says what happened: %s" % loser)
    check_eq(len(operator_transitions(s, cmd["payment_attempt_id"])), 1,
             "operator transitions after the race")
    check_eq(s.query("SELECT count(*) FROM ledger_entries WHERE payment_attempt_id = '%s'"
                     % cmd["payment_attempt_id"]), [["1"]], "ledger rows after the race")
    winner = [n for n, r in results.items() if r[0] == 200][0]
    check_eq(operator_transitions(s, cmd["payment_attempt_id"]), [[winner]],
             "the actor of the one resolution")


def provider_objects(s, port, op):
    cmd, pi = into_review(s, "pm_card_processing")
    path = "attempts/%s/resolve" % cmd["payment_attempt_id"]
    body = {"decision": "succeeded", "payment_intent_id": pi["id"]}
    st, doc = op.post(path, body)
    check_eq(st, 422, "resolve against the provider's evidence")
    check(doc.get("can_force") and "processing" in doc.get("provider_says", ""),
          "the objection says what the provider said: %s" % doc)
    check_eq(op.post(path, dict(body, force=True))[0], 400, "force without confirm")
    check_eq(op.post(path, dict(body, force=True, confirm=str(uuid.uuid4())))[0], 400,
             "force confirming another attempt")
    st, doc = op.post(path, dict(body, force=True, confirm=cmd["payment_attempt_id"]))
    check_eq((st, doc.get("forced"), doc.get("status")), (200, True, "SUCCEEDED"),
             "force confirmed")
    return cmd


def hostile_json(s, port, op):
    con.hostile_letter(s)
    positions = e2e.wait_until("the hostile letter listed", lambda: [
        p for p, r in con.letter_positions(op) if r == "schema_violation"], 30)
    st, doc, headers, raw = con.request(port, "GET", "/console/api/dead-letters/" + positions[0],
                                        headers=op.headers(csrf=False))
    check_eq(st, 200, "GET the hostile letter")
    check(CARD.encode() not in raw, "the card number reached the answer: %r" % raw[:400])
    check(b"************4242" in raw, "no masked card number in %r" % raw[:400])
    # JSON, never sniffed as HTML (nosniff), and no "</script>" even so.
    check(b"</script>" not in raw and b"<\\/script>" in raw,
          "the markup's closing tag is not escaped: %r" % raw[:400])
    check(doc["key"].startswith("key <script>"), "the key is not the letter's: %r" % doc["key"])
    check_eq(headers.get("Content-Type"), "application/json", "the letter's content type")
    check_eq(headers.get("X-Content-Type-Options"), "nosniff", "nosniff")
    st, doc = op.post("dead-letters/replay", {"positions": [positions[0]], "dry_run": True})
    check_eq(st, 200, "the hostile letter's preview")
    check(CARD not in json.dumps(doc), "the card number reached the preview")


def page_policy(port):
    st, _, headers, raw = con.request(port, "GET", "/console/")
    check_eq(st, 200, "GET /console/")
    csp = headers.get("Content-Security-Policy", "")
    check("script-src 'self'" in csp and "unsafe-inline" not in csp and
          "default-src 'none'" in csp, "the page's CSP: %r" % csp)
    check(not re.search(rb"<script(?![^>]*\bsrc=)", raw), "an inline script in the page")
    check(not re.search(rb"\son[a-z]+=", raw), "an inline event handler in the page")
    check(not re.search(rb"<style|style=", raw), "inline style in the page")
    for name in ("app.js", "money.js", "app.css"):
        st, _, h, body = con.request(port, "GET", "/console/" + name)
        check(st == 200 and body, "GET /console/%s" % name)
    for name in ("app.js", "money.js"):
        script = con.request(port, "GET", "/console/" + name)[3]
        check(not re.search(rb"\.(inner|outer)HTML\s*=|insertAdjacentHTML|document\.write|eval\(",
                            script), "%s writes markup" % name)
    check_eq(con.request(port, "GET", "/console/../etc/passwd")[0], 404, "a path outside the page")


def fuzz(port, op, secret, seed):
    rnd = random.Random(seed)
    anon = con.Client(port)
    paths = ["login", "logout", "session", "overview", "reviews", "attempts", "actions",
             "attempts/%s" % uuid.uuid4(), "attempts/%s/resolve" % uuid.uuid4(),
             "dead-letters", "dead-letters/0:%d" % rnd.randint(0, 99), "dead-letters/replay",
             "dead-letters/-1:0", "attempts/x/resolve", "../../x", "attempts?id=%00",
             "dead-letters?reason=<x>", "dead-letters?limit=99999", "dead-letters?since=x",
             "attempts?id=" + "a" * 5000]
    bodies = [b"", b"{", b"[]", b"null", b"{\"a\":1}", b"\x00\xff\xfe",
              json.dumps({"decision": "failed"}).encode(),
              json.dumps({"decision": "succeeded", "payment_intent_id": "<script>"}).encode(),
              json.dumps({"decision": "failed", "reason": "x" * 2000}).encode(),
              json.dumps({"decision": "failed", "reason": "ok", "force": "yes"}).encode(),
              json.dumps({"positions": ["0:0"] * 3, "dry_run": True}).encode(),
              json.dumps({"positions": ["%d:%d" % (i, i) for i in range(600)], "dry_run": True}).encode(),
              json.dumps({"positions": [None], "dry_run": True}).encode(),
              json.dumps({"positions": ["99:99999999999"], "dry_run": True}).encode(),
              json.dumps({"token": "cct_" + "\u00e9" * 40}).encode(),
              json.dumps({"token": ["x"]}).encode(),
              b"{\"decision\":\"failed\",\"decision\":\"succeeded\"}",
              b"[" * 5000]
    for i in range(int(os.environ.get("FUZZ_ROUNDS", "400"))):
        who = op if rnd.random() < 0.7 else anon
        path = rnd.choice(paths)
        body = rnd.choice(bodies)
        if rnd.random() < 0.3:
            body = bytes(rnd.getrandbits(8) for _ in range(rnd.randint(1, 300)))
        method = rnd.choice(["GET", "POST", "POST", "PUT", "DELETE"])
        headers = who.headers(csrf=rnd.random() < 0.8)
        if rnd.random() < 0.1:
            headers["Cookie"] = rnd.choice(["charged_console=", "charged_console=%s" % ("x" * 70),
                                            "a=b; charged_console=" + "Z" * 43, ";;;="])
        st, doc, _, _ = con.request(port, method, "/console/api/" + path, body, headers)
        check(400 <= st < 500 or st == 200,
              "round %d: %s %s -> %d %s (seed %d)" % (i, method, path, st, doc, seed))
        if who is op and path == "logout" and st == 200:
            check_eq(op.login(secret)[0], 200, "signing in again after a random logout")
    # Random logouts may have ended op's session: a new one must work.
    check_eq(con.Client(port, secret).get("session")[0], 200, "the console after the fuzzing")


def scenario(new):
    s = new("console_access", worker_env={"RECONCILER_SEARCH_LAG_MS": "0"})
    s.start_worker()
    name, port = con.start_console(s)
    alice_secret = con.token(s, "olivia", "operator")
    alice = con.Client(port, alice_secret)
    bob = con.Client(port, con.token(s, "oscar", "operator"))

    no_session(port)
    page_policy(port)
    review, _ = into_review(s, "pm_card_mastercard")
    viewer_reads_only(s, port, review)
    csrf_required(s, port, review, alice)
    revoked_at_once(s, port)
    race(s, port, alice, bob)
    forced = provider_objects(s, port, alice)
    hostile_json(s, port, alice)

    actions = s.query("SELECT actor, action, target, outcome FROM console_actions"
                      " WHERE action = 'resolve' ORDER BY id")
    check([a for a in actions if a[2] == forced["payment_attempt_id"] and a[3] == "resolved"
           and a[0] == "olivia"], "the forced resolution is not in console_actions: %s" % actions)
    check_eq(status(s, review), "REQUIRES_REVIEW", "the review nobody resolved")

    seed = int(os.environ.get("FUZZ_SEED", str(int(time.time()))))
    e2e.log("FUZZ_SEED=%d" % seed)
    fuzz(port, alice, alice_secret, seed)
    check(s.process(name).poll() is None, "the console died")


if __name__ == "__main__":
    raise SystemExit(e2e.main(scenario))
