#!/usr/bin/env python3
"""chargectl against real Kafka, PostgreSQL, psp-sim and a worker: dead
letters of each reason are listed with their reason and ids, filters narrow
them, show prints the contract's headers, a letter refused by a worker
setting is charged once when replayed after the setting changed (and never
again, however often or concurrently it is replayed), attempt show tells the
story of an attempt whose first answer was lost, --json always parses,
--help documents everything, and reading never commits any offset."""
import json
import subprocess
import time

import charged_e2e as e2e

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
        assert len(by[reason]) == 1, (reason, by[reason])
        d = by[reason][0]
        if cmd is not None:
            assert d["payment_attempt_id"] == cmd["payment_attempt_id"], (reason, d)
            assert d["order_id"] == cmd["order_id"], (reason, d)
        assert d["original"]["topic"] == s.topics["commands"], d

    # Filters narrow the list.
    only = ctl_json(s, "dlq", "list", "--reason", "amount_over_limit")
    assert [d["reason"] for d in only] == ["amount_over_limit"], only
    only = ctl_json(s, "dlq", "list", "--attempt", gbp["payment_attempt_id"])
    assert [d["reason"] for d in only] == ["currency_not_allowed"], only
    only = ctl_json(s, "dlq", "list", "--order", first["order_id"])
    assert [d["reason"] for d in only] == ["idempotency_key_conflict"], only
    assert len(ctl_json(s, "dlq", "list", "--limit", "3")) == 3
    assert ctl_json(s, "dlq", "list", "--since", "2099-01-01T00:00:00Z") == []
    assert ctl_json(s, "dlq", "list", "--until", "2000-01-01T00:00:00Z") == []
    assert len(ctl_json(s, "dlq", "list", "--since", "1h")) == len(want)
    table = ctl(s, "dlq", "list", "--reason", "key_mismatch").stdout.decode()
    assert "key_mismatch" in table and bad["payment_attempt_id"] in table, table

    # show prints the contract's headers; the value is pretty JSON.
    pos = by["amount_over_limit"][0]["position"]
    text = ctl(s, "dlq", "show", pos).stdout.decode()
    for h in ("dlq.reason: amount_over_limit", "dlq.error:", "dlq.original.topic:",
              "dlq.original.partition:", "dlq.original.offset:", "dlq.original.timestamp:",
              "dlq.consumer.group: " + s.group, "dlq.worker:", "dlq.failed_at:"):
        assert h in text, (h, text)
    assert '"amount": 9000' in text, text
    shown = ctl_json(s, "dlq", "show", by["invalid_utf8"][0]["position"])
    assert "hex" in shown["value"], shown["value"]
    assert "\\xff" in ctl(s, "dlq", "show", by["invalid_utf8"][0]["position"]).stdout.decode()

    # Card letters cannot be replayed: their digits are masked.
    p = ctl(s, "dlq", "replay", by["card_data_refused"][0]["position"], check=False)
    assert p.returncode == 1 and b"masked" in p.stderr, p.stderr

    # The refused command, replayed after the setting changed, is charged once.
    dry = ctl_json(s, "dlq", "replay", pos, "--dry-run")
    assert dry[0]["sent"] is False
    assert not [c for c in s.ledger() if c["idempotency_key"] == over["idempotency_key"]]
    s.kill_worker(w, e2e.signal.SIGTERM)
    s.start_worker(WORKER_MAX_AMOUNT="100000", WORKER_ALLOWED_CURRENCIES="EUR,USD")
    sent = ctl_json(s, "dlq", "replay", pos)
    assert sent[0]["sent"] is True, sent
    key = over["idempotency_key"]
    e2e.wait_until("the replayed command charged", lambda: [
        c for c in s.ledger() if c["idempotency_key"] == key], 60)
    # Again, and twice at once: no new charge.
    ctl(s, "dlq", "replay", pos)
    procs = [subprocess.Popen([CTL, "dlq", "replay", "--reason", "amount_over_limit"],
                              env=s.env(), stdout=subprocess.DEVNULL) for _ in range(2)]
    assert [p.wait(60) for p in procs] == [0, 0]
    s.wait_settled(3, timeout=120)
    charges = [c for c in s.ledger() if c["idempotency_key"] == key]
    assert len(charges) == 1 and charges[0]["amount"] == 9000, charges
    rows = s.query("SELECT status FROM payment_attempts WHERE id = '%s'" % over["payment_attempt_id"])
    assert rows == [["SUCCEEDED"]], rows
    replayed = [d for d in s.dead_letters() if d["key"] == over["payment_attempt_id"]]
    assert len(replayed) == 1, "a replay was dead-lettered again"
    s.check_invariants()

    # attempt show of an attempt whose first answer psp-sim dropped.
    lost = e2e.new_command(amount=777)
    s.psp_put("/faults", {"rules": [{"kind": "drop_after", "key": lost["idempotency_key"],
                                     "times": 1}]})
    s.publish([lost])
    s.wait_settled(4, timeout=120)
    story = ctl_json(s, "attempt", "show", lost["payment_attempt_id"])
    assert story["status"] == "SUCCEEDED", story
    outcomes = [c["outcome"] for c in story["provider_call_log"]]
    assert outcomes == ["unknown", "succeeded"], outcomes
    assert story["provider_call_log"][1]["replayed"] is True
    assert [(t["old_status"], t["new_status"], t["cause"]) for t in story["transitions"]] == [
        (None, "PENDING", "worker"), ("PENDING", "PROCESSING", "worker"),
        ("PROCESSING", "SUCCEEDED", "worker")], story["transitions"]
    assert [e["event_type"] for e in story["result_events"]] == ["charge.succeeded"]
    assert story["ledger_entries"][0]["amount"] == 777
    text = ctl(s, "attempt", "show", lost["payment_attempt_id"]).stdout.decode()
    assert "unknown" in text and "succeeded" in text and "PROCESSING" in text, text

    # attempt list and its filters.
    listed = ctl_json(s, "attempt", "list", "--order", lost["order_id"])
    assert [a["payment_attempt_id"] for a in listed] == [lost["payment_attempt_id"]]
    assert ctl_json(s, "attempt", "list", "--status", "REJECTED") == []
    assert len(ctl_json(s, "attempt", "list", "--limit", "2")) == 2
    assert ctl_json(s, "attempt", "list", "--older-than", "1d") == []

    # Reading the DLQ committed nothing for any group.
    lag = json.loads(s.tool("lag", "chargectl-dlq-reader", s.topics["dlq"]))
    assert all(p["committed"] < 0 for p in lag["partitions"]), lag

    # Errors: one line, the contract's exit codes.
    def fails(code, *args, env=None):
        p = ctl(s, *args, check=False, env=env)
        err = p.stderr.decode().strip()
        assert p.returncode == code, (args, p.returncode, err)
        assert err and "\n" not in err, (args, err)
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
        assert sub in top, sub
    dlq_help = ctl(s, "dlq", "--help").stdout.decode()
    for flag in ("list", "show", "replay", "--reason", "--since", "--until", "--attempt",
                 "--order", "--limit", "--json", "--dry-run"):
        assert flag in dlq_help, flag
    att_help = ctl(s, "attempt", "--help").stdout.decode()
    for flag in ("show", "list", "--order", "--status", "--older-than", "--limit", "--json"):
        assert flag in att_help, flag


if __name__ == "__main__":
    raise SystemExit(e2e.main(scenario))
