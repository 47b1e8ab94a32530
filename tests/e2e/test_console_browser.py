#!/usr/bin/env python3
"""The console in a real browser: Debian's chromium, driven by
playwright-core (tests/browser/console_flow.mjs), against real PostgreSQL,
Kafka, psp-sim, a worker and `charged console`.

This file sets the scene: an attempt in review whose intent the provider
holds succeeded (made under the attempt's key by a request the worker's
own call was refused for: it only names the attempt, so the browser books
it forced, confirmed by the attempt id), a hostile dead letter (markup and a card number in its key,
value and headers, written as nothing of charged would write it), and a
dead letter of a valid command. The browser signs in, sees the overview,
resolves the review, reads the hostile letter (it must render as text,
number masked, nothing run), previews and replays the other letter and
opens the attempt's timeline by order and by intent id, and sets the
provider's global limit (issue 38). Then the database
and psp-sim's ledger say whether it happened: the review resolved once by
the token's name, the replayed command charged once, each action in
console_actions. Screenshots: e2e-logs/<scenario>/screenshots/."""

import json
import os
import shutil
import subprocess

import charged_console as con
import charged_e2e as e2e
from charged_e2e import check, check_eq
from test_chargectl_resolve import into_review, status
import test_auditor_steps as auth_steps

BROWSER_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "browser")
CHROMIUM = os.environ.get("CHROMIUM", "/usr/bin/chromium")


def scenario(new):
    check(os.path.exists(CHROMIUM), "no chromium at %s (deploy/install-deps.sh)" % CHROMIUM)
    check(os.path.isdir(os.path.join(BROWSER_DIR, "node_modules", "playwright-core")),
          "playwright-core is not installed in tests/browser (deploy/install-deps.sh)")
    s = new("console_browser", worker_env={"RECONCILER_SEARCH_LAG_MS": "0"})
    worker = s.start_worker()
    name, port = con.start_console(s, CONSOLE_COOKIE_SECURE="1",
                                   CONSOLE_WORKER_METRICS="http://127.0.0.1:%d/metrics"
                                   % s.admin_port(worker))
    secret = con.token(s, "olivia", "operator")
    op = con.Client(port, secret)

    review, pi = into_review(s, "pm_card_mastercard")
    con.hostile_letter(s)
    replay_cmd = e2e.new_command(amount=700)
    con.replayable_letter(s, replay_cmd)
    letters = e2e.wait_until("both letters listed", lambda: (
        lambda ls: ls if len(ls) == 2 else None)(con.letter_positions(op)), 30)
    by_reason = {r: p for p, r in letters}
    # An authorization captured in part, and the void that lost the hold to
    # the capture (issue 37): the timeline shows both steps.
    auth = auth_steps.authorize(s, 1000)
    s.psql(s.db, "BEGIN;%s%sCOMMIT;" % (
        auth_steps.attempt_moved(auth, "PENDING", "PROCESSING"),
        auth_steps.attempt_moved(auth, "PROCESSING", "AUTHORIZED")))
    loser = auth_steps.reject_void(s, auth, "authorization_held")
    capture = auth_steps.plant_capture(s, auth, 600)
    auth_steps.capture_at_psp(s, auth, 600)
    # A void in review on an authorization psp-sim still holds: the queue
    # shows its kind, the browser's SUCCEEDED is refused, FAILED resolves.
    held = auth_steps.authorize(s, 800)
    void_in_review = auth_steps.plant_void(s, held, status="REQUIRES_REVIEW")
    shots = os.path.join(s.dir, "screenshots")
    os.makedirs(shots, exist_ok=True)
    flow = {"base": "http://127.0.0.1:%d" % port, "token": secret,
            "review": {"attempt": review["payment_attempt_id"], "intent": pi["id"],
                       "order": review["order_id"],
                       # Shown as money: 1500 EUR is 15.00 EUR.
                       "money": "%d.%02d %s" % (review["amount"] // 100, review["amount"] % 100,
                                                review["currency"])},
            "hostile": by_reason["schema_violation"], "replay": by_reason["database_refused"],
            "card": con.CARD,
            "steps": {"attempt": auth["attempt"], "capture": capture, "void": loser,
                      "captured": "6.00 EUR", "void_reason": "authorization_held"},
            "step_review": {"void": void_in_review},
            "limits": {"global": 100, "actor": "olivia"},
            "commands_topic": s.topics["commands"], "shots": shots}
    env = dict(os.environ, CONSOLE_FLOW=json.dumps(flow), CHROMIUM=CHROMIUM,
               CONSOLE_FLOW_TIMEOUT_MS=str(int(e2e.scaled(30) * 1000)))
    p = subprocess.run(["node", os.path.join(BROWSER_DIR, "console_flow.mjs")], env=env,
                       capture_output=True, timeout=e2e.scaled(300), cwd=BROWSER_DIR)
    e2e.log("browser:", p.stdout.decode().strip(), p.stderr.decode().strip()[-3000:])
    check(p.returncode == 0, "the browser's walk failed: %s" % p.stderr.decode()[-3000:])
    saw = json.loads(p.stdout.decode().strip().splitlines()[-1])
    check_eq(saw["pages"], ["login", "overview", "review", "step-review", "dead-letter",
                            "replay-preview",
                            "replay-sent", "attempt", "attempt-steps", "limits"],
             "pages the browser saw")
    check_eq(saw["step_timeline"], ["transition:PENDING → PROCESSING",
                                    "transition:PROCESSING → AUTHORIZED", "void:new → REJECTED",
                                    "capture:new → PENDING", "capture:PENDING → PROCESSING",
                                    "transition:AUTHORIZED → SUCCEEDED",
                                    "capture:PROCESSING → SUCCEEDED"],
             "the authorization's timeline in the browser, in time order")
    for page in saw["pages"]:
        check(os.path.getsize(os.path.join(shots, page + ".png")) > 10000,
              "the screenshot of %s is empty" % page)

    # What the clicks did, from the database and the provider's own ledger.
    check_eq(status(s, review), "SUCCEEDED", "the review resolved in the browser")
    check_eq(s.query("SELECT actor, reason FROM attempt_transitions WHERE payment_attempt_id"
                     " = '%s' AND cause = 'operator'" % review["payment_attempt_id"]),
             [["olivia", "confirmed with the provider"]], "the operator's transition")
    check_eq(s.query("SELECT w.status, w.reason, p.status, p.held_by IS NULL FROM void_attempts w"
                     " JOIN payment_attempts p ON p.id = w.payment_attempt_id WHERE w.id = '%s'"
                     % void_in_review),
             [["FAILED", "still held at the provider", "AUTHORIZED", "t"]],
             "the void resolved in the browser, the hold given back")
    check_eq(s.query("SELECT actor, new_status FROM void_transitions WHERE void_id = '%s'"
                     " AND cause = 'operator'" % void_in_review), [["olivia", "FAILED"]],
             "the void's operator transition")
    check_eq([c for c in s.psp_get("/ledger").get("cancels", [])
              if c.get("payment_intent_id") == held["pi"]], [], "psp-sim canceled nothing")
    check(("olivia", "resolve", "refused") in [tuple(r) for r in s.query(
        "SELECT actor, action, outcome FROM console_actions WHERE target = '%s'"
        % void_in_review)], "the refused SUCCEEDED is in console_actions")
    check_eq(s.query("SELECT actor, after->>'global_rps' FROM provider_budget_changes"),
             [["olivia", "100"]], "the limit the browser set, with its actor")
    e2e.wait_until("the replayed command charged", lambda: status(s, replay_cmd) == "SUCCEEDED", 60)
    charges = [c for c in s.ledger() if c.get("idempotency_key") == replay_cmd["idempotency_key"]]
    check_eq(len(charges), 1, "psp-sim charges of the replayed command")
    replayed = [m for m in s.tool("dump", s.topics["commands"]).splitlines()
                if replay_cmd["payment_attempt_id"] in m]
    check_eq(len(replayed), 1, "replays on the command topic")
    headers = dict((h[0], h[1]) for h in json.loads(replayed[0]).get("headers", []))
    check_eq(headers.get("dlq.replayed_by"), "olivia", "dlq.replayed_by of the replay")
    actions = [tuple(r) for r in s.query("SELECT actor, action, outcome FROM console_actions"
                                         " ORDER BY id")]
    for want in [("olivia", "login", "ok"), ("olivia", "resolve", "resolved"),
                 ("olivia", "replay", "ok"), ("olivia", "provider_limits", "ok"),
                 ("olivia", "logout", "ok")]:
        check(want in actions, "%s is not in console_actions: %s" % (want, actions))
    # The current screenshots, for docs/console.md (tools/console-screenshots.sh).
    keep = os.environ.get("CHARGED_CONSOLE_SHOTS")
    if keep:
        os.makedirs(keep, exist_ok=True)
        for page in saw["pages"]:
            shutil.copy(os.path.join(shots, page + ".png"), os.path.join(keep, page + ".png"))


if __name__ == "__main__":
    raise SystemExit(e2e.main(scenario))
