#!/usr/bin/env python3
"""chargectl attempt resolve against real PostgreSQL, psp-sim and a worker.

Attempts reach REQUIRES_REVIEW the way they do in production: the attempt's
idempotency key was already used at the provider with other parameters (here
by the test, POSTing to psp-sim directly, as another client holding the key
would), so the worker's charge gets 400 idempotency_error and the worker
cannot tell whether or how the attempt was paid. What the earlier request
left at the provider (a succeeded, processing or declined intent, or one of
another attempt) sets up each case.

Covered: --succeeded with the intent made under the attempt's key by that
earlier request is refused without --force (the worker's own call under
the key was refused: the intent only names the attempt, its ownership is
unproven, issue 34) and books the charge with --force (transition with
cause operator and the actor, ledger row, charge.succeeded in the outbox,
the look-ups as provider calls, the evidence saying forced and unproven);
--succeeded with an intent that is not succeeded or not this attempt's is
refused, and accepted with --force with the evidence saying so; an intent booked for another attempt is refused
even with --force; --failed is refused while the provider holds a succeeded
intent for the attempt, accepted with --force, and accepted when the
provider has nothing; an unreachable provider refuses unless --force; two
concurrent resolutions, one wins; only REQUIRES_REVIEW attempts resolve;
bad usage exits 2 with one line; a missing PROVIDER_API_KEY stops resolve
only."""
import json
import os
import pwd
import subprocess
import urllib.error
import urllib.parse
import urllib.request
import uuid

import charged_e2e as e2e
from charged_e2e import check, check_eq

CTL = e2e.CHARGECTL


def ctl(s, *args, env=None):
    return s.run([CTL] + list(args), check=False, extra_env=env)


def one_line(p):
    err = p.stderr.decode().strip()
    check(err and "\n" not in err, "want one line on stderr, got %r" % err)
    return err


def resolve_ok(s, *args, env=None):
    """Runs resolve --json; exit 0 and its parsed output."""
    p = ctl(s, "attempt", "resolve", *(list(args) + ["--json"]), env=env)
    check(p.returncode == 0, "resolve %s: exit %d, want 0; stderr %r" % (
        " ".join(args), p.returncode, p.stderr.decode()))
    return json.loads(p.stdout.decode())


def resolve_refused(s, *args, mention=(), env=None):
    """Runs resolve; exit 1, one line on stderr naming each of `mention`."""
    p = ctl(s, "attempt", "resolve", *args, env=env)
    err = one_line(p)
    check(p.returncode == 1, "resolve %s: exit %d, want 1; stderr %r" % (
        " ".join(args), p.returncode, err))
    for word in mention:
        check(word in err, "resolve %s: stderr %r does not mention %r" % (
            " ".join(args), err, word))
    return err


def psp_charge(s, key, amount, payment_method, attempt_id, order_id, currency="eur"):
    """POSTs a charge to psp-sim's provider API as another client would;
    returns the intent (a declined one comes back inside the 402)."""
    body = urllib.parse.urlencode({
        "amount": str(amount), "currency": currency, "payment_method": payment_method,
        "confirm": "true", "off_session": "true",
        "metadata[payment_attempt_id]": attempt_id, "metadata[order_id]": order_id,
    }).encode()
    req = urllib.request.Request(
        "http://127.0.0.1:%d/v1/payment_intents" % s.psp_port, data=body, method="POST",
        headers={"Authorization": "Bearer " + e2e.API_KEY, "Idempotency-Key": key,
                 "Content-Type": "application/x-www-form-urlencoded"})
    try:
        with urllib.request.urlopen(req, timeout=30) as r:
            return json.load(r)
    except urllib.error.HTTPError as e:
        doc = json.load(e)
        check(e.code == 402 and "payment_intent" in doc.get("error", {}),
              "psp-sim answered the set-up charge %d: %s" % (e.code, doc))
        return doc["error"]["payment_intent"]


def into_review(s, payment_method, attempt_id=None, amount=1500):
    """A new attempt the worker leaves in REQUIRES_REVIEW: its key was used at
    the provider first, with `payment_method` (the worker sends pm_card_visa)
    and metadata naming `attempt_id` (default: the attempt itself). Returns
    (command, the intent that earlier request left)."""
    cmd = e2e.new_command(amount=amount)
    intent = psp_charge(s, cmd["idempotency_key"], amount, payment_method,
                        attempt_id or cmd["payment_attempt_id"], cmd["order_id"])
    s.publish([cmd])
    e2e.wait_until("attempt %s in REQUIRES_REVIEW" % cmd["payment_attempt_id"],
                   lambda: status(s, cmd) == "REQUIRES_REVIEW", 60)
    return cmd, intent


def status(s, cmd):
    rows = s.query("SELECT status FROM payment_attempts WHERE id = '%s'"
                   % cmd["payment_attempt_id"])
    return rows[0][0] if rows else None


def story(s, cmd):
    p = ctl(s, "attempt", "show", cmd["payment_attempt_id"], "--json")
    check(p.returncode == 0, "attempt show: exit %d: %r" % (p.returncode, p.stderr))
    return json.loads(p.stdout.decode())


def unchanged(s, cmd, what):
    """After a refusal: still in review, nothing written by the operator."""
    st = story(s, cmd)
    check_eq(st["status"], "REQUIRES_REVIEW", "status after %s" % what)
    check_eq([t["cause"] for t in st["transitions"] if t["cause"] == "operator"], [],
             "operator transitions after %s" % what)
    check_eq(st["ledger_entries"], [], "ledger entries after %s" % what)
    check_eq([c["operation"] for c in st["provider_call_log"]], ["charge"],
             "provider calls after %s" % what)


def last_transition(st):
    t = st["transitions"][-1]
    check_eq((t["old_status"], t["new_status"], t["cause"]),
             ("REQUIRES_REVIEW", st["status"], "operator"), "the last transition")
    return t


def scenario(new):
    # psp-sim's search lists an intent at once (--search-lag-ms 0), so
    # resolve need not wait for it (RECONCILER_SEARCH_LAG_MS, 60 s by default).
    s = new("chargectl_resolve", worker_env={"RECONCILER_SEARCH_LAG_MS": "0"})
    s.start_worker()

    # ---- --succeeded with the intent made under the attempt's key ----
    # The earlier request used the attempt's key with another card: it was
    # charged, for this attempt, amount and currency. But the worker's own
    # call under the key was refused (idempotency_error): charged never had
    # the intent from its own call, and its metadata, anyone's to write,
    # proves nothing. Refused without --force; the operator who has seen
    # the provider's request log books it with --force.
    paid, paid_pi = into_review(s, "pm_card_mastercard")
    check_eq(paid_pi["status"], "succeeded", "status of the set-up intent")
    resolve_refused(s, paid["payment_attempt_id"], "--succeeded", paid_pi["id"],
                    mention=(paid_pi["id"], "not proven", "only names it", "force"))
    unchanged(s, paid, "a refused --succeeded of an intent that only names the attempt")
    out = resolve_ok(s, paid["payment_attempt_id"], "--succeeded", paid_pi["id"], "--force",
                     "--actor", "alice", "--reason", "paid with the customer's other card")
    check_eq((out["status"], out["provider_payment_id"], out["actor"]),
             ("SUCCEEDED", paid_pi["id"], "alice"), "resolve's answer")
    check_eq((out["evidence"]["forced"], out["evidence"]["provider"],
              out["evidence"]["ownership"]["verdict"]), (True, "unproven", "unproven"),
             "evidence of a resolution forced over an unproven intent")
    st = story(s, paid)
    check_eq((st["status"], st["provider_payment_id"]), ("SUCCEEDED", paid_pi["id"]),
             "the resolved attempt")
    t = last_transition(st)
    check_eq((t["actor"], t["reason"]), ("alice", "paid with the customer's other card"),
             "actor and reason of the operator's transition")
    check_eq(t["evidence"]["decision"], "SUCCEEDED", "decision in the evidence")
    check_eq(sorted(l["operation"] for l in t["evidence"]["lookups"]), ["retrieve", "search"],
             "look-ups in the evidence")
    check_eq([(l["kind"], l["amount"], l["currency"], l["provider_payment_id"])
              for l in st["ledger_entries"]], [("charge", 1500, "EUR", paid_pi["id"])],
             "ledger entries of the resolved attempt")
    check_eq([e["event_type"] for e in st["result_events"]],
             ["charge.requires_review", "charge.succeeded"], "result events")
    ops = [(c["operation"], c["outcome"], c["actor"]) for c in st["provider_call_log"]]
    check_eq(sorted(ops[1:]), [("retrieve", "succeeded", "alice"), ("search", "succeeded", "alice")],
             "the look-ups in the provider call log (after the worker's charge)")
    rows = s.query("SELECT payload->>'provider_payment_id', payload->>'amount' FROM outbox"
                   " WHERE payment_attempt_id = '%s' AND event_type = 'charge.succeeded'"
                   % paid["payment_attempt_id"])
    check_eq(rows, [[paid_pi["id"], "1500"]], "the charge.succeeded event's payload")
    # The worker commits every WORKER_COMMIT_INTERVAL_MS: wait for it.
    e2e.wait_until("offsets committed", lambda: s.lag()["lag"] == 0, 30)
    # Before the resolutions below, forced against the provider, break them
    # on purpose (this one's intent was charged under the attempt's key).
    s.check_invariants()

    # ---- only REQUIRES_REVIEW attempts resolve ----
    resolve_refused(s, paid["payment_attempt_id"], "--failed", "--reason", "x",
                    mention=("SUCCEEDED", "REQUIRES_REVIEW"))
    plain = e2e.new_command(amount=300)
    s.publish([plain])
    e2e.wait_until("a plain attempt charged", lambda: status(s, plain) == "SUCCEEDED", 60)
    resolve_refused(s, plain["payment_attempt_id"], "--succeeded", "pi_x",
                    mention=("SUCCEEDED",))
    resolve_refused(s, str(uuid.uuid4()), "--failed", "--reason", "x",
                    mention=("no attempt",))

    # ---- --succeeded with an intent that is not succeeded ----
    slow, slow_pi = into_review(s, "pm_card_processing")
    check_eq(slow_pi["status"], "processing", "status of the set-up intent")
    resolve_refused(s, slow["payment_attempt_id"], "--succeeded", slow_pi["id"],
                    mention=(slow_pi["id"], "processing", "--force"))
    unchanged(s, slow, "a refused --succeeded of a processing intent")
    out = resolve_ok(s, slow["payment_attempt_id"], "--succeeded", slow_pi["id"],
                     "--force", "--actor", "bob")
    ev = out["evidence"]
    check_eq((ev["forced"], ev["provider"]), (True, "contradicts"),
             "evidence of a forced --succeeded")
    check("processing" in ev["provider_says"], "the evidence does not say what the "
          "provider said: %s" % ev)
    t = last_transition(story(s, slow))
    check_eq((t["actor"], t["reason"], t["evidence"]["forced"]),
             ("bob", "resolved by operator", True), "the forced transition")

    # ---- --succeeded with an intent of another attempt ----
    # The earlier request was declined; the operator names a succeeded
    # intent whose metadata names another attempt.
    other_cmd, _ = into_review(s, "pm_card_chargeDeclined")
    stranger = psp_charge(s, "elsewhere:" + str(uuid.uuid4()), 1500, "pm_card_visa",
                          str(uuid.uuid4()), other_cmd["order_id"])
    resolve_refused(s, other_cmd["payment_attempt_id"], "--succeeded", stranger["id"],
                    mention=(stranger["id"], "another attempt"))
    unchanged(s, other_cmd, "a refused --succeeded of another attempt's intent")
    # The intent's own metadata names the other attempt: that settles it
    # even while the search may lag.
    resolve_refused(s, other_cmd["payment_attempt_id"], "--succeeded", stranger["id"],
                    env={"RECONCILER_SEARCH_LAG_MS": "600000"},
                    mention=(stranger["id"], "another attempt"))
    # An intent already booked for an attempt is refused, --force or not.
    resolve_refused(s, other_cmd["payment_attempt_id"], "--succeeded", paid_pi["id"],
                    "--force", mention=(paid_pi["id"], "already booked",
                                        paid["payment_attempt_id"]))
    unchanged(s, other_cmd, "a resolution with an intent booked elsewhere")
    out = resolve_ok(s, other_cmd["payment_attempt_id"], "--succeeded", stranger["id"],
                     "--force", "--actor", "carol")
    check_eq((out["evidence"]["forced"], out["evidence"]["provider"]), (True, "contradicts"),
             "evidence of a forced --succeeded with another attempt's intent")
    st = story(s, other_cmd)
    check_eq(st["ledger_entries"][0]["provider_payment_id"], stranger["id"],
             "the forced resolution's ledger entry")

    # ---- --failed while the provider holds a succeeded intent ----
    dispute, dispute_pi = into_review(s, "pm_card_mastercard")
    resolve_refused(s, dispute["payment_attempt_id"], "--failed", "--reason",
                    "customer says no", mention=("succeeded", dispute_pi["id"]))
    unchanged(s, dispute, "a refused --failed")
    out = resolve_ok(s, dispute["payment_attempt_id"], "--failed", "--reason",
                     "refunded by hand at the provider", "--force", "--actor", "dave")
    check_eq((out["status"], out["evidence"]["forced"]), ("FAILED", True),
             "a forced --failed")
    st = story(s, dispute)
    t = last_transition(st)
    check_eq((t["actor"], t["reason"], t["evidence"]["provider"]),
             ("dave", "refunded by hand at the provider", "contradicts"),
             "the forced --failed transition")
    check_eq(st["ledger_entries"], [], "ledger entries of a FAILED attempt")
    check_eq([e["event_type"] for e in st["result_events"]],
             ["charge.requires_review", "charge.failed"], "result events of a forced --failed")

    # ---- --failed when the provider has nothing for the attempt ----
    # The earlier request under the key was another attempt's: the provider
    # has no intent naming this one.
    nothing, _ = into_review(s, "pm_card_mastercard", attempt_id=str(uuid.uuid4()))
    # No answer from the provider: refused, unless --force.
    gone = {"PROVIDER_BASE_URL": "http://127.0.0.1:%d" % e2e.free_port()}
    resolve_refused(s, nothing["payment_attempt_id"], "--failed", "--reason", "x", env=gone,
                    mention=("did not answer", "--force"))
    unchanged(s, nothing, "a --failed without the provider")
    # A search that may lag behind the attempt's last call proves nothing yet.
    resolve_refused(s, nothing["payment_attempt_id"], "--failed", "--reason", "x",
                    env={"RECONCILER_SEARCH_LAG_MS": "600000"},
                    mention=("not be up to date", "try again in", "--force"))
    unchanged(s, nothing, "a --failed while the search may lag")
    # Two operators at once: one resolution wins, the other writes nothing.
    argv = [CTL, "attempt", "resolve", nothing["payment_attempt_id"], "--failed",
            "--reason", "never reached the provider for this attempt"]
    procs = [subprocess.Popen(argv, env=s.env(), stdout=subprocess.DEVNULL,
                              stderr=subprocess.PIPE) for _ in range(2)]
    ends = [(p.returncode, err.decode().strip()) for p in procs
            for _, err in [p.communicate(timeout=e2e.scaled(60))]]
    check_eq(sorted(rc for rc, _ in ends), [0, 1],
             "exit statuses of two concurrent resolutions: %s" % ends)
    loser = [err for rc, err in ends if rc == 1][0]
    st = story(s, nothing)
    check_eq(st["status"], "FAILED", "status of an attempt the provider never charged")
    t = last_transition(st)
    user = pwd.getpwuid(os.geteuid()).pw_name
    check_eq((t["actor"], t["evidence"]["forced"], t["evidence"]["provider"],
              t["evidence"]["search_lag_ms"]),
             (user, False, "agrees", 0), "actor (the OS user) and evidence of a --failed")
    # The winner asked the provider (the search, then its consistent list:
    # the search's "none" is not enough). So did the loser, unless it read
    # the attempt already resolved (it then asks nothing): every call made
    # is recorded, the loser's too (only its decision was refused: the row
    # changed, or was held by the winner's statement), in whichever order
    # the two wrote them.
    calls = ["charge", "search", "list"]
    if "not REQUIRES_REVIEW" not in loser:
        check("changed while it was being resolved" in loser
              or "locked by another session" in loser, "the loser's line: %r" % loser)
        calls += ["search", "list"]
    check_eq(sorted(c["operation"] for c in st["provider_call_log"]), sorted(calls),
             "provider calls of two resolutions (the loser: %r)" % loser)
    check_eq([e["event_type"] for e in st["result_events"]],
             ["charge.requires_review", "charge.failed"], "result events of a --failed")

    # With --force, an unreachable provider does not stop a resolution.
    lost, _ = into_review(s, "pm_card_mastercard", attempt_id=str(uuid.uuid4()))
    out = resolve_ok(s, lost["payment_attempt_id"], "--failed", "--reason", "x", "--force",
                     env=gone)
    check_eq((out["evidence"]["forced"], out["evidence"]["provider"]), (True, "no_answer"),
             "evidence of a forced resolution without the provider")
    check_eq([c["outcome"] for c in story(s, lost)["provider_call_log"][1:]], ["unknown"],
             "the unanswered look-up in the provider call log")

    # Text output, for people.
    text_cmd, text_pi = into_review(s, "pm_card_mastercard")
    p = ctl(s, "attempt", "resolve", text_cmd["payment_attempt_id"], "--succeeded",
            text_pi["id"], "--actor", "erin", "--force")
    out = p.stdout.decode()
    check(p.returncode == 0 and "SUCCEEDED" in out and "erin" in out and "unproven" in out
          and "resolved with --force" in out,
          "resolve's text: exit %d, %r" % (p.returncode, out))

    # ---- the key is needed by resolve only ----
    queue_cmd, _ = into_review(s, "pm_card_mastercard")
    env = s.env()
    env.pop("PROVIDER_API_KEY")
    p = subprocess.run([CTL, "attempt", "resolve", queue_cmd["payment_attempt_id"], "--failed",
                        "--reason", "x"], env=env, capture_output=True)
    err = one_line(p)
    check(p.returncode == 2 and "PROVIDER_API_KEY" in err,
          "resolve without PROVIDER_API_KEY: exit %d, %r" % (p.returncode, err))
    p = subprocess.run([CTL, "attempt", "list", "--status", "REQUIRES_REVIEW", "--json"],
                       env=env, capture_output=True)
    check(p.returncode == 0, "attempt list without PROVIDER_API_KEY: exit %d, %r" % (
        p.returncode, p.stderr))
    check_eq([a["payment_attempt_id"] for a in json.loads(p.stdout.decode())],
             [queue_cmd["payment_attempt_id"]], "the review queue")
    p = ctl(s, "attempt", "resolve", queue_cmd["payment_attempt_id"], "--failed", "--reason",
            "x", env={"PROVIDER_API_KEY": ""})
    err = one_line(p)
    check(p.returncode == 2 and "PROVIDER_API_KEY" in err,
          "resolve with an empty PROVIDER_API_KEY: exit %d, %r" % (p.returncode, err))
    check_eq(status(s, queue_cmd), "REQUIRES_REVIEW", "status after refusals")

    # ---- bad usage: exit 2, one line ----
    aid = queue_cmd["payment_attempt_id"]
    for args, word in [
            ([], "PAYMENT_ATTEMPT_ID"),
            ([aid], "--succeeded"),
            (["not-a-uuid", "--failed", "--reason", "x"], "UUID"),
            ([aid, "--failed"], "--reason"),
            ([aid, "--succeeded", "pi_1", "--failed", "--reason", "x"], "one of"),
            ([aid, "--succeeded"], "--succeeded"),
            ([aid, "--succeeded", "pi 1"], "payment intent id"),
            ([aid, "--failed", "--reason", ""], "--reason"),
            ([aid, "--failed", "--reason", "two\nlines"], "--reason"),
            ([aid, "--failed", "--reason", "x", "--actor", ""], "--actor"),
            ([aid, aid, "--failed", "--reason", "x"], "unexpected"),
            ([aid, "--failed", "--reason", "x", "--bogus"], "--bogus")]:
        p = ctl(s, "attempt", "resolve", *args)
        err = one_line(p)
        check(p.returncode == 2 and word in err, "resolve %s: exit %d, want 2 and %r in %r" % (
            args, p.returncode, word, err))
    check_eq(status(s, queue_cmd), "REQUIRES_REVIEW", "status after bad usage")

    # ---- --help ----
    p = ctl(s, "attempt", "resolve", "--help")
    text = p.stdout.decode()
    check(p.returncode == 0, "resolve --help: exit %d" % p.returncode)
    for word in ("--succeeded", "--failed", "--reason", "--actor", "--force", "--json",
                 "REQUIRES_REVIEW", "PROVIDER_API_KEY"):
        check(word in text, "resolve --help does not mention %r" % word)
    text = ctl(s, "attempt", "--help").stdout.decode()
    for word in ("resolve", "REQUIRES_REVIEW"):
        check(word in text, "attempt --help does not mention %r" % word)


if __name__ == "__main__":
    raise SystemExit(e2e.main(scenario))
