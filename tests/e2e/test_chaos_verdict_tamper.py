#!/usr/bin/env python3
"""The chaos verdict catches tampered evidence. After a short tools/chaos
run that passes (psp-sim left running, the stack up; without its other
client, whose race with charged is test_chaos_short's), the evidence is
changed from outside, one thing at a time, the way a defect would leave
it, and `tools/chaos verdict --run DIR` is run after each change: it must
exit 1 with the row that names the change violated, naming the very
attempt, refund, event or order, while the rows it flipped before stay
violated.

0. First the run's other client (tools/chaos's own) makes, after the fact,
   a declined charge naming a paid attempt and its order, and a refund
   naming a paid refund, on its charge's intent, failed at once: the
   verdict still passes (another client's objects are no violation; a
   finding of the audit about them is expected only as foreign_intent).

1. SQL UPDATE: a SUCCEEDED attempt flipped to FAILED -> "FAILED with a
   charge" (and "settled without its result event": no charge.failed;
   "attempts settled by a foreign object": FAILED while its own charge
   succeeded).
2. SQL DELETE: a refund command's record (a REJECTED refund) deleted ->
   "commands lost".
3. Kafka: the first dead letter of a DLQ partition deleted (Kafka's
   DeleteRecords) -> "dead letters <its reason> missing" (and "conflicting
   resends not dead-lettered" for a conflict).
4. Kafka: a copy of the newest result event produced to the results topic
   after the last fault (past the republish window when the run settled
   before its last fault; the order service then reads it, and applies
   nothing) -> "events published twice".
5. HTTP: a second charge at psp-sim for a paid attempt and order, under a
   new key with the same metadata -> "attempts charged twice", "orders
   charged twice" and the auditor's findings.
6. HTTP: psp-sim made to forget its keys at once (its admin retention),
   then a second charge under a paid attempt's own key -> "keys charged
   twice".
7. SQL UPDATE: a SUCCEEDED attempt's provider_payment_id set to a declined
   intent of the run's other client (foreign.jsonl) -> "attempts settled by
   a foreign object" (and "SUCCEEDED without its charge").
8. SQL UPDATE: a SUCCEEDED refund's provider_refund_id set to a refund of
   the other client -> "refunds settled by a foreign object".
Nothing of charged is changed for this: no flag, no code path."""
import importlib.machinery
import importlib.util
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.parse
import urllib.request
import uuid

import charged_e2e as e2e
from charged_e2e import check, check_eq

HERE = os.path.dirname(os.path.abspath(__file__))
CHAOS = os.path.join(HERE, "..", "..", "tools", "chaos")


def load_chaos():
    loader = importlib.machinery.SourceFileLoader("chaos_tool", CHAOS)
    spec = importlib.util.spec_from_loader("chaos_tool", loader)
    mod = importlib.util.module_from_spec(spec)
    loader.exec_module(mod)
    return mod


def judge(run_dir):
    """(exit status, {row name: row}) of tools/chaos verdict --run run_dir."""
    p = subprocess.run([sys.executable, CHAOS, "verdict", "--run", run_dir],
                       capture_output=True, timeout=e2e.scaled(300))
    check(p.returncode in (0, 1), lambda: "tools/chaos verdict exited %d: %s" % (
        p.returncode, p.stderr.decode()[-2000:]))
    with open(os.path.join(run_dir, "verdict.json")) as f:
        v = json.load(f)
    return p.returncode, {r["row"]: r for r in v["rows"]}


def violated(rows):
    return sorted(n for n, r in rows.items() if r["violation"])


def expect(run_dir, before, new_rows, token):
    """The verdict fails; exactly `before` + new_rows are violated, and each
    new row names token in its examples. Returns the violated rows."""
    rc, rows = judge(run_dir)
    check_eq(rc, 1, "verdict exit status after the tampering (%s)" % new_rows)
    check_eq(violated(rows), sorted(set(before) | set(new_rows)), "rows violated")
    for n in new_rows:
        check(any(token in x for x in rows[n]["examples"]),
              "row %r does not name %s: %s" % (n, token, rows[n]["examples"]))
    e2e.log("tampering caught by %s, naming %s" % (new_rows, token))
    return violated(rows)


def delete_records(s, topic, partition, before):
    """Kafka's own DeleteRecordsCommand: the records of topic/partition
    before offset `before` are gone for every reader."""
    jars = subprocess.run([os.path.join(HERE, "..", "..", "deploy", "kafka", "fetch-jars.sh")],
                          capture_output=True, check=True).stdout.decode().strip()
    spec = os.path.join(tempfile.mkdtemp(), "offsets.json")
    with open(spec, "w") as f:
        json.dump({"version": 1, "partitions": [
            {"topic": topic, "partition": partition, "offset": before}]}, f)
    p = subprocess.run(["java", "-cp", os.path.join(jars, "*"),
                        "org.apache.kafka.tools.DeleteRecordsCommand", "--bootstrap-server",
                        s.kafka, "--offset-json-file", spec], capture_output=True,
                       timeout=e2e.scaled(120))
    check_eq(p.returncode, 0, "DeleteRecordsCommand (%s)" % p.stderr.decode()[-500:])


def scenario(new):
    e2e.stack_check()
    chaos = load_chaos()
    run_dir = tempfile.mkdtemp(prefix="chaos-tamper-", dir=e2e.BUILD)
    v, run_dir, s = chaos.run(2, count=600, chaos_s=45, keep=run_dir, leave_psp=True,
                              other_client=False)
    try:
        tamper(chaos, v, run_dir, s)
        shutil.rmtree(run_dir)  # kept only when the test fails
    finally:
        if s.psp and s.psp.poll() is None:
            s.psp.kill()
            s.psp.wait()


def tamper(chaos, v, run_dir, s):
    check(v["ok"], "the run itself failed its verdict: %s" % [
        r["row"] for r in v["rows"] if r["violation"]])
    rc, rows = judge(run_dir)
    check_eq((rc, violated(rows)), (0, []), "the recomputed verdict of the untouched run")
    with open(os.path.join(run_dir, "run.json")) as f:
        meta = json.load(f)
    bad = []

    # 0. The other client's objects, named in foreign.jsonl as in a run with it.
    oc = chaos.OtherClient(s, 2, run_dir, 100, 10)
    aid, order, amount = s.query(
        "SELECT id, order_id, amount FROM payment_attempts WHERE status = 'SUCCEEDED' AND "
        "idempotency_key LIKE 'chaos:%' ORDER BY id DESC LIMIT 1")[0]
    _, st = oc.charge({"attempt": aid, "order": order, "amount": int(amount),
                       "currency": "EUR"}, "tamper", method="pm_card_chargeDeclined")
    check_eq(st, "requires_payment_method", "the other client's charge")
    rid, raid, ramount = s.query(
        "SELECT x.id, x.payment_attempt_id, x.amount FROM refund_attempts x JOIN"
        " payment_attempts p ON p.id = x.payment_attempt_id WHERE x.status = 'SUCCEEDED' AND"
        " x.idempotency_key LIKE 'chaos-refund:%' AND p.refunded_amount + x.amount <= p.amount"
        " ORDER BY x.id DESC LIMIT 1")[0]
    oc.refund({"refund": rid, "attempt": raid, "amount": int(ramount)}, "tamper")
    oc.out.close()
    with open(os.path.join(run_dir, "foreign.jsonl")) as f:
        made = [json.loads(l) for l in f]
    check_eq([(d.get("object"), d.get("on"), d.get("status")) for d in made],
             [("charge", None, None), (None, None, "requires_payment_method"),
              ("refund", "ours", None), (None, None, "succeeded"), (None, None, "failed")],
             "what the other client made")
    rc, rows = judge(run_dir)
    check_eq((rc, violated(rows)), (0, []), "the verdict with the other client's objects")

    # 1. A SUCCEEDED attempt flipped to FAILED.
    # One of the run's own commands (the order service's orders have rows of
    # their own that a flip would also contradict), never refunded.
    flipped = s.query("SELECT id FROM payment_attempts WHERE status = 'SUCCEEDED' AND "
                      "idempotency_key LIKE 'chaos:%' AND refund_reserved = 0 "
                      "ORDER BY id LIMIT 1")[0][0]
    s.psql(s.db, "UPDATE payment_attempts SET status = 'FAILED', reason = 'tampered' "
           "WHERE id = '%s'" % flipped)
    bad = expect(run_dir, bad, ["FAILED with a charge", "settled without its result event",
                                "attempts settled by a foreign object"], flipped)

    # 2. A refund command's record deleted (with its history and events).
    gone = s.query("SELECT id FROM refund_attempts WHERE status = 'REJECTED' AND "
                   "idempotency_key LIKE 'chaos-refund:%' ORDER BY id LIMIT 1")[0][0]
    s.psql(s.db, "BEGIN; DELETE FROM refund_transitions WHERE refund_id = '%s'; "
           "DELETE FROM outbox WHERE refund_id = '%s'; DELETE FROM refund_attempts "
           "WHERE id = '%s'; COMMIT" % (gone, gone, gone))
    bad = expect(run_dir, bad,
                 ["commands lost (no attempt, refund, capture or void recorded)"], gone)

    # 3. A dead letter deleted from its topic (Kafka's DeleteRecords: the
    #    first letter of a partition, by moving its log start past it).
    letters = [json.loads(l) for l in s.tool("dump", s.topics["dlq"]).splitlines() if l.strip()]
    ids = {}
    for d in letters:
        h = dict((x[0], x[1]) for x in d["headers"])
        ids[h["dlq.id"]] = ids.get(h["dlq.id"], 0) + 1
    firsts = {}
    for d in letters:
        if d["partition"] not in firsts or d["offset"] < firsts[d["partition"]]["offset"]:
            firsts[d["partition"]] = d
    victim = [d for _, d in sorted(firsts.items()) if ids[dict(
        (x[0], x[1]) for x in d["headers"])["dlq.id"]] == 1][0]
    h = dict((x[0], x[1]) for x in victim["headers"])
    delete_records(s, s.topics["dlq"], victim["partition"], victim["offset"] + 1)
    token = victim["key"] if h["dlq.reason"] != "idempotency_key_conflict" else (
        lambda v: v.get("refund_id") or v["payment_attempt_id"])(json.loads(victim["value"]))
    rows_named = ["dead letters %s missing" % h["dlq.reason"]]
    if h["dlq.reason"] == "idempotency_key_conflict":
        rows_named.append("conflicting resends not dead-lettered")
    bad = expect(run_dir, bad, rows_named, token)

    # 4. An event published twice, long after every fault of the run.
    out = s.tool("dump", s.topics["results"])
    events = [json.loads(l) for l in out.splitlines() if l.strip()]
    newest = max(events, key=lambda m: int(m["timestamp"]))
    last_fault = max(b for _, a, b in meta["disruptions"])
    if int(newest["timestamp"]) <= last_fault + 2000:
        # The run settled before its last fault ended: no event comes after
        # it. A copy is unexplained all the same once it is later than any
        # fault could make a relay publish again (the verdict's rule).
        until = (last_fault + chaos.REPUBLISH_WITHIN_MS) / 1000.0 + 1
        e2e.log("no result event after the last fault: the copy waits %.0f s, past the "
                "republish window" % max(0, until - time.time()))
        e2e.wait_until("the republish window after the last fault over",
                       lambda: time.time() > until, e2e.scaled(90), 0.5)
    s.tool("produce", s.topics["results"], stdin=(json.dumps(
        {"key": newest["key"], "value": newest["value"], "headers": newest["headers"]})
        + "\n").encode())
    eid = json.loads(newest["value"])["event_id"]
    # The order service reads the copy (and, deduplicating, applies nothing),
    # so that its position is at the end again; then SIGTERM. Its positions
    # are in its database: any group will do.
    out = open(os.path.join(run_dir, "order_service_tamper.log"), "ab")
    svc = subprocess.Popen([chaos.ORDER_PYTHON, chaos.ORDER_SERVICE, "run"], stdout=out,
                           stderr=out, env=s.env({"ORDERS_DATABASE_URL": meta["orders_db"],
                                                  "ORDERS_GROUP_ID": "orders-tamper-" + s.tag,
                                                  "CHARGED_API_URL": "http://127.0.0.1:%d"
                                                  % meta["api_port"]}))
    try:
        e2e.wait_until("the order service at the end of the results topic",
                       lambda: chaos.order_service_behind(s, meta["orders_db"]) == 0,
                       e2e.scaled(120))
    finally:
        svc.send_signal(signal.SIGTERM)
        status = svc.wait(timeout=e2e.scaled(60))
    check_eq(status, 0, "the order service's exit status on SIGTERM")
    bad = expect(run_dir, bad, ["events published twice"], eid)

    # 5. A second charge at the provider for a paid attempt and its order.
    attempt, order, amount = s.query(
        "SELECT id, order_id, amount FROM payment_attempts WHERE status = 'SUCCEEDED' "
        "AND idempotency_key LIKE 'chaos:%%' AND id <> '%s' ORDER BY id LIMIT 1" % flipped)[0]
    body = urllib.parse.urlencode({
        "amount": amount, "currency": "eur", "payment_method": "pm_card_visa",
        "confirm": "true", "metadata[payment_attempt_id]": attempt,
        "metadata[order_id]": order}).encode()
    req = urllib.request.Request("http://127.0.0.1:%d/v1/payment_intents" % s.psp_port,
                                 data=body, method="POST", headers={
                                     "Authorization": "Bearer " + e2e.API_KEY,
                                     "Idempotency-Key": "tamper-" + str(uuid.uuid4())})
    with urllib.request.urlopen(req, timeout=30) as r:
        check_eq(json.load(r)["status"], "succeeded", "the second charge's status")
    rc, rows = judge(run_dir)
    check_eq(rc, 1, "verdict exit status after a second charge")
    for n, token in (("attempts charged twice", attempt), ("orders charged twice", order)):
        check(rows[n]["violation"] and any(token in x for x in rows[n]["examples"]),
              "row %r after a second charge of %s: %s" % (n, token, rows[n]))
    check(rows["auditor findings (scheduled windows + one audit of the run)"]["violation"],
          "the audit of the run found nothing after a second charge")
    e2e.log("second charge caught by the ledger rows and the audit: %s" % violated(rows))

    # 6. A second charge under one key: psp-sim made to forget keys at once
    # (its admin retention), then a POST under a paid attempt's own key,
    # which executes again once the key is forgotten.
    key, attempt6 = s.query(
        "SELECT idempotency_key, id FROM payment_attempts WHERE status = 'SUCCEEDED' "
        "AND idempotency_key LIKE 'chaos:%%' AND id NOT IN ('%s', '%s') ORDER BY id LIMIT 1"
        % (flipped, attempt))[0]
    req = urllib.request.Request("http://127.0.0.1:%d/retention" % s.psp_admin,
                                 data=json.dumps({"key_retention_ms": 1}).encode(),
                                 method="PUT", headers={"Content-Type": "application/json"})
    urllib.request.urlopen(req, timeout=30).close()
    body = urllib.parse.urlencode({
        "amount": 100, "currency": "eur", "payment_method": "pm_card_visa",
        "confirm": "true", "metadata[payment_attempt_id]": attempt6}).encode()

    def executed_again():
        req = urllib.request.Request("http://127.0.0.1:%d/v1/payment_intents" % s.psp_port,
                                     data=body, method="POST", headers={
                                         "Authorization": "Bearer " + e2e.API_KEY,
                                         "Idempotency-Key": key})
        try:
            with urllib.request.urlopen(req, timeout=30) as r:
                return r.headers.get("Idempotent-Replayed") != "true"
        except urllib.error.HTTPError:  # the key still held, with other parameters
            return False
    e2e.wait_until("psp-sim to execute under the forgotten key %s" % key, executed_again, 30)
    rc, rows = judge(run_dir)
    check_eq(rc, 1, "verdict exit status after a second charge under one key")
    check(rows["keys charged twice"]["violation"] and
          any(key in x for x in rows["keys charged twice"]["examples"]),
          "row 'keys charged twice' after a second charge under %s: %s" % (
              key, rows["keys charged twice"]))
    e2e.log("second charge under one key caught: %s" % violated(rows))
    bad = violated(rows)

    # 7. An attempt booked on the other client's declined intent that names it.
    other = chaos.other_client_record(run_dir)
    ledger = s.psp_get("/ledger")
    declined = {c["payment_intent_id"]: c["payment_attempt_id"] for c in ledger["charges"]
                if c["idempotency_key"] in other and c["outcome"] == "declined"}
    check(declined, "the run's other client made no declined charge")
    taken = (flipped, attempt, attempt6)
    paid = {x[0] for x in s.query("SELECT id FROM payment_attempts WHERE status = 'SUCCEEDED'"
                                  " AND idempotency_key LIKE 'chaos:%'") if x[0] not in taken}
    check(paid, "no SUCCEEDED attempt left to tamper with")
    # The attempt it names when that one is paid, else any paid attempt.
    named = sorted((a, pi) for pi, a in declined.items() if a in paid)
    victim, intent = (named or [(sorted(paid)[0], sorted(declined)[0])])[0]
    s.psql(s.db, "UPDATE payment_attempts SET provider_payment_id = '%s' WHERE id = '%s'"
           % (intent, victim))
    bad = expect(run_dir, bad, ["attempts settled by a foreign object",
                                "SUCCEEDED without its charge"], victim)

    # 8. A refund booked on a refund of the other client.
    recorded = {x[0] for x in s.query("SELECT provider_refund_id FROM refund_attempts WHERE"
                                      " provider_refund_id IS NOT NULL")}
    foreign_refunds = sorted(x["provider_refund_id"] for x in ledger["refunds"]
                             if x["idempotency_key"] in other
                             and x["provider_refund_id"] not in recorded)
    check(foreign_refunds, "the run's other client made no refund (none recorded by ours)")
    refund = s.query("SELECT id FROM refund_attempts WHERE status = 'SUCCEEDED' AND "
                     "idempotency_key LIKE 'chaos-refund:%' ORDER BY id LIMIT 1")[0][0]
    s.psql(s.db, "UPDATE refund_attempts SET provider_refund_id = '%s' WHERE id = '%s'"
           % (foreign_refunds[0], refund))
    expect(run_dir, bad, ["refunds settled by a foreign object"], refund)


if __name__ == "__main__":
    raise SystemExit(e2e.main(scenario))
