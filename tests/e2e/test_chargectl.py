#!/usr/bin/env python3
"""chargectl against real Kafka, PostgreSQL, psp-sim and a worker: dead
letters of each reason are listed with their reason and ids, filters narrow
them, show prints the contract's headers, a letter refused by a worker
setting is charged once when replayed after the setting changed (and never
again, however often or concurrently it is replayed), attempt show tells the
story of an attempt whose first answer was lost, --json always parses,
--help documents everything, and reading never commits any offset."""
import json
import re
import subprocess
import time

import charged_api as api
import charged_e2e as e2e
from charged_e2e import check, check_eq

CTL = e2e.CHARGECTL


def ctl(s, *args, check=True, env=None):
    p = s.run([CTL] + list(args), check=False, extra_env=env)
    if check and p.returncode != 0:
        raise e2e.Failure("chargectl %s exited %d: %s" % (" ".join(args), p.returncode,
                                                          p.stderr.decode()))
    return p


def ctl_json(s, *args):
    out = ctl(s, *(list(args) + ["--json"])).stdout.decode()
    return json.loads(out)


def letters_by_reason(s):
    out = {}
    for d in ctl_json(s, "dlq", "list", "--limit", "1000"):
        out.setdefault(d["reason"], []).append(d)
    return out


def calls_counted(s, attempt_id):
    """attempt show's provider_calls, as text and as JSON, against the rows
    of provider_calls; returns the count."""
    rows = int(s.query("SELECT count(*) FROM provider_calls WHERE payment_attempt_id = '%s'"
                       % attempt_id)[0][0])
    story = ctl_json(s, "attempt", "show", attempt_id)
    check_eq((story["provider_calls"], len(story["provider_call_log"])), (rows, rows),
             "attempt show --json: provider_calls and the call log, against %d rows" % rows)
    text = ctl(s, "attempt", "show", attempt_id).stdout.decode()
    said = [l.split() for l in text.splitlines() if l.startswith("provider_calls ")]
    check_eq(said, [["provider_calls", str(rows)]], "attempt show's provider_calls line")
    listed = text.split("\nprovider calls:\n", 1)[1].split("\n\n", 1)[0].splitlines()
    check_eq(len(listed) - 1, rows, "rows under 'provider calls:' (after the header) in %s"
             % text)
    return rows


def refunds(s, ctl_json):
    """refund show, list and resolve, and the refunds in attempt show."""
    paid = api.insert_attempt(s, "SUCCEEDED", amount=1000)
    review = api.insert_refund(s, paid, "REQUIRES_REVIEW", 300, reserved=False,
                               reason="requires_review: the provider's answer is ambiguous")
    unknown = api.insert_refund(s, paid, "UNKNOWN", 200)
    shown = ctl_json(s, "refund", "show", review["id"])
    check_eq((shown["refund_id"], shown["status"], shown["transitions"], shown["result_events"]),
             (review["id"], "REQUIRES_REVIEW", [], []), "refund show of a refund in review")
    listed = ctl_json(s, "refund", "list", "--attempt", paid["id"], "--status", "REQUIRES_REVIEW")
    check_eq([r["refund_id"] for r in listed], [review["id"]], "refund list --status")
    check_eq(len(ctl_json(s, "refund", "list", "--attempt", paid["id"], "--limit", "1")), 1,
             "refund list --limit 1")
    # Refused: a SUCCEEDED decision without the provider's refund id (2), a
    # refund not in review (1); nothing written.
    p = ctl(s, "refund", "resolve", review["id"], "--status", "SUCCEEDED", "--reason", "seen",
            check=False)
    check_eq(p.returncode, 2, "resolve SUCCEEDED without --provider-refund-id")
    done = api.insert_refund(s, paid, "PROCESSING", 100)
    p = ctl(s, "refund", "resolve", done["id"], "--status", "FAILED", "--reason", "x",
            check=False)
    check_eq(p.returncode, 1, "resolve of a PROCESSING refund")
    check_eq(api.refund_counts(s, done["id"]), ("PROCESSING", "-", 0, 0), "refused resolve")
    # The refund in review was refunded (its reservation taken again), the
    # UNKNOWN one never reached the provider (its reservation given back).
    # The provider is asked first: it holds no refund re_ctl_0001, so the
    # decision is refused (nothing written) unless forced, and a forced one
    # says so in its evidence.
    p = ctl(s, "refund", "resolve", review["id"], "--status", "SUCCEEDED", "--reason", "seen",
            "--provider-refund-id", "re_ctl_0001", "--actor", "erin", check=False)
    check_eq(p.returncode, 1, "resolve SUCCEEDED that the provider contradicts")
    check("the provider has no refund re_ctl_0001" in p.stderr.decode(), p.stderr.decode())
    check_eq(api.refund_counts(s, review["id"])[0], "REQUIRES_REVIEW", "a refused resolve")
    out = ctl_json(s, "refund", "resolve", review["id"], "--status", "SUCCEEDED", "--reason",
                   "refunded per the provider's dashboard", "--provider-refund-id",
                   "re_ctl_0001", "--actor", "erin", "--force")
    check_eq((out["evidence"]["provider"], out["evidence"]["forced"]), ("contradicts", True),
             "a forced resolve's evidence")
    check_eq((out["old_status"], out["status"], out["actor"]), ("REQUIRES_REVIEW", "SUCCEEDED",
                                                                "erin"), "resolve's answer")
    check_eq(api.refund_counts(s, review["id"]), ("SUCCEEDED", "re_ctl_0001", 1, 1),
             "the resolved refund")
    # The charge's intent was never made at psp-sim (the rows are inserted):
    # its list of refunds answers 404, which is no evidence that nothing was
    # refunded, so FAILED is refused unless forced.
    p = ctl(s, "refund", "resolve", unknown["id"], "--status", "FAILED", "--reason",
            "no refund at the provider", "--actor", "erin", check=False)
    check_eq(p.returncode, 1, "resolve FAILED when the provider cannot list the refunds")
    check("404" in p.stderr.decode() and "--force" in p.stderr.decode(), p.stderr.decode())
    check_eq(api.refund_counts(s, unknown["id"])[0], "UNKNOWN", "a refused FAILED")
    ctl(s, "refund", "resolve", unknown["id"], "--status", "FAILED", "--reason",
        "no refund at the provider", "--actor", "erin", "--force")
    check_eq(api.refund_counts(s, unknown["id"])[0], "FAILED", "the UNKNOWN refund resolved")
    check_eq(api.refund_money(s, paid["id"]), (400, 300, 1), "the charge's refund money")
    shown = ctl_json(s, "refund", "show", review["id"])
    check_eq([(t["old_status"], t["new_status"], t["cause"], t["actor"]) for t in
              shown["transitions"]], [("REQUIRES_REVIEW", "SUCCEEDED", "operator", "erin")],
             "the operator's transition in refund show")
    check_eq([e["event_type"] for e in shown["result_events"]], ["refund.succeeded"],
             "result events in refund show")
    # Resolved once: again is refused.
    p = ctl(s, "refund", "resolve", review["id"], "--status", "SUCCEEDED", "--reason", "again",
            "--provider-refund-id", "re_ctl_0001", check=False)
    check_eq(p.returncode, 1, "a second resolve")
    story = ctl_json(s, "attempt", "show", paid["id"])
    check_eq((story["refunded_amount"], sorted(r["refund_id"] for r in story["refunds"])),
             (300, sorted([review["id"], unknown["id"], done["id"]])), "attempt show's refunds")
    text = ctl(s, "attempt", "show", paid["id"]).stdout.decode()
    check("\nrefunds:\n" in text and "re_ctl_0001" in text, "attempt show's refunds as text")
    text = ctl(s, "refund", "show", review["id"]).stdout.decode()
    check("operator" in text and "re_ctl_0001" in text, "refund show as text: %s" % text)
    for code, args in ((2, ["refund", "show", "not-a-uuid"]),
                       (1, ["refund", "show", "00000000-0000-0000-0000-000000000000"]),
                       (2, ["refund", "list", "--status", "DONE"]),
                       (2, ["refund", "resolve", review["id"], "--status", "PENDING",
                            "--reason", "x"]),
                       (2, ["refund", "frobnicate"])):
        p = ctl(s, *args, check=False)
        err = p.stderr.decode().strip()
        check(p.returncode == code and err and "\n" not in err,
              "chargectl %s: exit %d (want %d), stderr %r" % (" ".join(args), p.returncode,
                                                              code, err))
    helptext = ctl(s, "refund", "--help").stdout.decode()
    for flag in ("show", "list", "resolve", "--attempt", "--status", "--limit", "--reason",
                 "--provider-refund-id", "--actor", "--json"):
        check(flag in helptext, "chargectl refund --help does not mention %r" % flag)


def scenario(new):
    s = new("chargectl", psp_args=["--seed", "2"])
    limits = {"WORKER_MAX_AMOUNT": "5000", "WORKER_ALLOWED_CURRENCIES": "EUR,USD"}
    w = s.start_worker(**limits)

    # One dead letter of each reason the worker produces.
    over = e2e.new_command(amount=9000)
    usd_ok = e2e.new_command(currency="USD", amount=100)
    gbp = e2e.new_command(currency="GBP", amount=100)
    first = e2e.new_command(amount=1200)
    s.publish([over, usd_ok, gbp, first])
    s.wait_settled(2, timeout=120)
    s.publish([dict(first, amount=1300)])  # same key, other amount
    bad = e2e.new_command()
    s.produce_raw([
        {"key": bad["payment_attempt_id"], "value": '{"type": "charge.requested"'},
        {"key": "wrong-key", "value": json.dumps(bad)},
        {"key": bad["payment_attempt_id"], "value": json.dumps(dict(bad, amount=0))},
        {"key": bad["payment_attempt_id"], "value": ""},
        {"key": bad["payment_attempt_id"], "value_hex": (json.dumps(bad)[:-1] + ',"x":"\xff"}').encode("latin-1").hex()},
        {"key": bad["payment_attempt_id"], "value": json.dumps(dict(bad, payment_method="4242424242424242"))},
        {"key": bad["payment_attempt_id"], "value": "x" * 70000},
    ])
    want = {"amount_over_limit": over, "currency_not_allowed": gbp,
            "idempotency_key_conflict": first, "malformed_json": None, "key_mismatch": bad,
            "schema_violation": bad, "empty_value": None, "invalid_utf8": None,
            "card_data_refused": bad, "oversized": None}
    by = e2e.wait_until("a dead letter of each reason",
                        lambda: (lambda b: b if set(want) <= set(b) else None)(letters_by_reason(s)), 60)
    for reason, cmd in want.items():
        check(len(by[reason]) == 1, "want one %s dead letter, got %d: %s" % (
            reason, len(by[reason]), by[reason]))
        d = by[reason][0]
        if cmd is not None:
            check_eq(d["payment_attempt_id"], cmd["payment_attempt_id"],
                     "payment_attempt_id of the %s dead letter %s" % (reason, d))
            check_eq(d["order_id"], cmd["order_id"],
                     "order_id of the %s dead letter %s" % (reason, d))
        check_eq(d["original"]["topic"], s.topics["commands"],
                 "original topic of the %s dead letter %s" % (reason, d))

    # Filters narrow the list.
    only = ctl_json(s, "dlq", "list", "--reason", "amount_over_limit")
    check_eq([d["reason"] for d in only], ["amount_over_limit"],
             "reasons listed by dlq list --reason amount_over_limit (%s)" % only)
    only = ctl_json(s, "dlq", "list", "--attempt", gbp["payment_attempt_id"])
    check_eq([d["reason"] for d in only], ["currency_not_allowed"],
             "reasons listed by dlq list --attempt (%s)" % only)
    only = ctl_json(s, "dlq", "list", "--order", first["order_id"])
    check_eq([d["reason"] for d in only], ["idempotency_key_conflict"],
             "reasons listed by dlq list --order (%s)" % only)
    check_eq(len(ctl_json(s, "dlq", "list", "--limit", "3")), 3, "letters listed with --limit 3")
    check_eq(ctl_json(s, "dlq", "list", "--since", "2099-01-01T00:00:00Z"), [],
             "letters listed --since 2099")
    check_eq(ctl_json(s, "dlq", "list", "--until", "2000-01-01T00:00:00Z"), [],
             "letters listed --until 2000")
    check_eq(len(ctl_json(s, "dlq", "list", "--since", "1h")), len(want),
             "letters listed --since 1h")
    table = ctl(s, "dlq", "list", "--reason", "key_mismatch").stdout.decode()
    check("key_mismatch" in table and bad["payment_attempt_id"] in table,
          "the table of dlq list --reason key_mismatch lacks the reason or attempt %s: %s" % (
              bad["payment_attempt_id"], table))

    # show prints the contract's headers; the value is pretty JSON.
    pos = by["amount_over_limit"][0]["position"]
    text = ctl(s, "dlq", "show", pos).stdout.decode()
    for h in ("dlq.reason: amount_over_limit", "dlq.error:", "dlq.original.topic:",
              "dlq.original.partition:", "dlq.original.offset:", "dlq.original.timestamp:",
              "dlq.consumer.group: " + s.group, "dlq.worker:", "dlq.failed_at:"):
        check(h in text, "dlq show does not print %r: %s" % (h, text))
    check('"amount": 9000' in text, "dlq show does not print the value's amount: %s" % text)
    shown = ctl_json(s, "dlq", "show", by["invalid_utf8"][0]["position"])
    check("hex" in shown["value"], "the invalid UTF-8 value is not shown as hex: %r"
          % shown["value"])
    text = ctl(s, "dlq", "show", by["invalid_utf8"][0]["position"]).stdout.decode()
    check("\\xff" in text, "dlq show does not escape the invalid byte as \\xff: %s" % text)

    # Card letters cannot be replayed: their digits are masked.
    p = ctl(s, "dlq", "replay", by["card_data_refused"][0]["position"], check=False)
    check(p.returncode == 1 and b"masked" in p.stderr,
          "replay of a card letter: exit %d, want 1 and 'masked' on stderr: %r" % (
              p.returncode, p.stderr))

    # The refused command, replayed after the setting changed, is charged once.
    dry = ctl_json(s, "dlq", "replay", pos, "--dry-run", "--actor", "e2e-operator")
    check(dry[0]["sent"] is False, "replay --dry-run says it sent: %s" % dry)
    # ... and shows the message it would send: the original topic, the
    # replay's two headers and none of the worker's.
    msg = dry[0].get("message") or {}
    names = dict((h[0], h[1]) for h in msg.get("headers", []))
    check(msg.get("topic") == s.topics["commands"] and msg.get("key") == over["payment_attempt_id"]
          and names.get("dlq.replayed_by") == "e2e-operator"
          and names.get("dlq.replayed_from") == dry[0]["replayed_from"]
          and not [n for n in names if n.startswith("dlq.") and n not in (
              "dlq.replayed_by", "dlq.replayed_from")],
          "replay --dry-run --json message: %s" % msg)
    charged = [c for c in s.ledger() if c["idempotency_key"] == over["idempotency_key"]]
    check(not charged, "the refused command was charged before any replay: %s" % charged)
    s.kill_worker(w, e2e.signal.SIGTERM)
    s.start_worker(WORKER_MAX_AMOUNT="100000", WORKER_ALLOWED_CURRENCIES="EUR,USD")
    sent = ctl_json(s, "dlq", "replay", pos, "--actor", "e2e-operator")
    check(sent[0]["sent"] is True, "replay did not send: %s" % sent)
    landed = [json.loads(l) for l in s.tool("dump", s.topics["commands"]).splitlines()
              if l.strip()]
    landed = [m for m in landed if m["partition"] == sent[0]["sent_partition"]
              and m["offset"] == sent[0]["sent_offset"]]
    check(len(landed) == 1 and ["dlq.replayed_by", "e2e-operator"] in landed[0]["headers"],
          "the replayed command lacks dlq.replayed_by e2e-operator: %s" % landed)
    key = over["idempotency_key"]
    e2e.wait_until("the replayed command charged", lambda: [
        c for c in s.ledger() if c["idempotency_key"] == key], 60)
    # Again, and twice at once: no new charge.
    ctl(s, "dlq", "replay", pos)
    procs = [subprocess.Popen([CTL, "dlq", "replay", "--reason", "amount_over_limit"],
                              env=s.env(), stdout=subprocess.DEVNULL) for _ in range(2)]
    check_eq([p.wait(e2e.scaled(60)) for p in procs], [0, 0],
             "exit statuses of two concurrent replays")
    s.wait_settled(3, timeout=120)
    charges = [c for c in s.ledger() if c["idempotency_key"] == key]
    check(len(charges) == 1 and charges[0]["amount"] == 9000,
          "the replayed command is to be charged once, 9000: %s" % charges)
    rows = s.query("SELECT status FROM payment_attempts WHERE id = '%s'" % over["payment_attempt_id"])
    check_eq(rows, [["SUCCEEDED"]], "status of the replayed attempt")
    replayed = [d for d in s.dead_letters() if d["key"] == over["payment_attempt_id"]]
    check(len(replayed) == 1, "a replay was dead-lettered again: %d dead letters for %s" % (
        len(replayed), over["payment_attempt_id"]))
    s.check_invariants()

    # attempt show of an attempt whose first answer psp-sim dropped.
    lost = e2e.new_command(amount=777)
    s.psp_put("/faults", {"rules": [{"kind": "drop_after", "key": lost["idempotency_key"],
                                     "times": 1}]})
    s.publish([lost])
    s.wait_settled(4, timeout=120)
    story = ctl_json(s, "attempt", "show", lost["payment_attempt_id"])
    check_eq(story["status"], "SUCCEEDED", "status in attempt show (%s)" % story)
    outcomes = [c["outcome"] for c in story["provider_call_log"]]
    check_eq(outcomes, ["unknown", "succeeded"], "outcomes of the provider call log")
    check(story["provider_call_log"][1]["replayed"] is True,
          "the second call is not marked replayed: %s" % story["provider_call_log"])
    check_eq([(t["old_status"], t["new_status"], t["cause"]) for t in story["transitions"]], [
        (None, "PROCESSING", "worker"), ("PROCESSING", "SUCCEEDED", "worker")],
        "transitions in attempt show (recorded and claimed in one)")
    check_eq([e["event_type"] for e in story["result_events"]], ["charge.succeeded"],
             "result events in attempt show")
    check(story["ledger_entries"] and story["ledger_entries"][0]["amount"] == 777,
          "ledger entries in attempt show: %s, want the first of amount 777"
          % story["ledger_entries"])
    text = ctl(s, "attempt", "show", lost["payment_attempt_id"]).stdout.decode()
    check("unknown" in text and "succeeded" in text and "PROCESSING" in text,
          "attempt show's text lacks unknown, succeeded or PROCESSING: %s" % text)
    calls_counted(s, lost["payment_attempt_id"])
    # Calls the attempt's own counter does not see (a reconciler's look-up
    # of an UNKNOWN attempt): provider_calls said 0 above a list of one.
    looked_up = api.insert_attempt(s, "UNKNOWN", reason="outcome_unknown: timeout")
    s.psql(s.db, "INSERT INTO provider_calls (payment_attempt_id, operation, started_at, "
           "latency_ms, outcome, http_status, actor) VALUES ('%s', 'retrieve', now(), 12, "
           "'unknown', 502, 'reconciler r1')" % looked_up["id"])
    check_eq(calls_counted(s, looked_up["id"]), 1, "provider calls of the looked-up attempt")

    refunds(s, ctl_json)

    # attempt list and its filters.
    listed = ctl_json(s, "attempt", "list", "--order", lost["order_id"])
    check_eq([a["payment_attempt_id"] for a in listed], [lost["payment_attempt_id"]],
             "attempts listed by attempt list --order")
    check_eq(ctl_json(s, "attempt", "list", "--status", "REJECTED"), [],
             "attempts listed --status REJECTED")
    check_eq(len(ctl_json(s, "attempt", "list", "--limit", "2")), 2,
             "attempts listed with --limit 2")
    check_eq(ctl_json(s, "attempt", "list", "--older-than", "1d"), [],
             "attempts listed --older-than 1d")

    # People read money as money, in the currency's ISO 4217 unit; --json
    # keeps minor units.
    for amount, cur, shown in ((1500, "EUR", "15.00 EUR"), (1500, "JPY", "1500 JPY"),
                               (1500, "KWD", "1.500 KWD")):
        a = api.insert_attempt(s, "FAILED", amount=amount, currency=cur)
        out = ctl(s, "attempt", "list", "--order", a["order_id"]).stdout.decode()
        check(" %s " % shown in out, "attempt list shows %d %s as %r: %s" % (amount, cur, shown, out))
        out = ctl(s, "attempt", "show", a["id"]).stdout.decode()
        check(re.search(r"^amount +%s$" % re.escape(shown), out, re.M),
              "attempt show: %d %s not as %r: %s" % (amount, cur, shown, out))
        check_eq(ctl_json(s, "attempt", "list", "--order", a["order_id"])[0]["amount"], amount,
                 "attempt list --json: minor units")

    # Reading the DLQ committed nothing for any group.
    lag = json.loads(s.tool("lag", "chargectl-dlq-reader", s.topics["dlq"]))
    check(all(p["committed"] < 0 for p in lag["partitions"]),
          "reading the DLQ committed offsets: %s" % lag)

    # Errors: one line, the contract's exit codes.
    def fails(code, *args, env=None):
        p = ctl(s, *args, check=False, env=env)
        err = p.stderr.decode().strip()
        check(p.returncode == code, "chargectl %s: exit %d, want %d; stderr %r" % (
            " ".join(args), p.returncode, code, err))
        check(err and "\n" not in err, "chargectl %s: want one line on stderr, got %r" % (
            " ".join(args), err))
    fails(2, "dlq", "list", "--reason", "nope")
    fails(2, "dlq", "list", "--since", "yesterday")
    fails(2, "dlq", "show", "notaposition")
    fails(1, "dlq", "show", "0:999999")
    fails(2, "attempt", "show", "not-a-uuid")
    fails(1, "attempt", "show", "00000000-0000-0000-0000-000000000000")
    fails(2, "attempt", "list", "--status", "DONE")
    fails(1, "dlq", "list", env={"KAFKA_BOOTSTRAP_SERVERS": "127.0.0.1:%d" % e2e.free_port(),
                                 "KAFKA_SOCKET_TIMEOUT_MS": "3000"})
    fails(1, "attempt", "list", env={"DATABASE_URL": "postgresql://x@127.0.0.1:%d/x" % e2e.free_port()})

    # --help documents every subcommand and flag.
    top = ctl(s, "--help").stdout.decode()
    for sub in ("migrate", "publish", "dlq", "attempt"):
        check(sub in top, "chargectl --help does not mention %r" % sub)
    dlq_help = ctl(s, "dlq", "--help").stdout.decode()
    for flag in ("list", "show", "replay", "--reason", "--since", "--until", "--attempt",
                 "--order", "--limit", "--json", "--dry-run", "--actor"):
        check(flag in dlq_help, "chargectl dlq --help does not mention %r" % flag)
    att_help = ctl(s, "attempt", "--help").stdout.decode()
    for flag in ("show", "list", "--order", "--status", "--older-than", "--limit", "--json"):
        check(flag in att_help, "chargectl attempt --help does not mention %r" % flag)


if __name__ == "__main__":
    raise SystemExit(e2e.main(scenario))
