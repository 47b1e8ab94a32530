#!/usr/bin/env python3
"""Adversary 37b: a storm on one set of authorizations: captures (part or
all), voids racing them, redeliveries, two workers on one partition set, the
reconciler and the api taking psp-sim's webhooks (succeeded, canceled,
amount_capturable_updated) at the same time, psp-sim losing answers
(drop_after, error_after, stall_after) with latency, and workers SIGKILLed
mid-run. Judged from psp-sim's ledger against our tables, after all settles:

- an intent captured at psp-sim under one of our captures' keys is that
  capture SUCCEEDED with psp-sim's amount, the authorization SUCCEEDED
  captured that amount and one ledger charge row of it (no money captured
  that our books do not show);
- an intent canceled by one of our voids is that void SUCCEEDED and the
  attempt VOIDED; none both captured and canceled;
- no capture or void of ours SUCCEEDED without its psp-sim row;
- no step left REQUIRES_REVIEW though psp-sim executed it under its own key."""
import json
import os
import random
import sys
import time
import uuid

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import charged_api as api  # noqa: E402
import charged_e2e as e2e  # noqa: E402
from charged_e2e import check  # noqa: E402

N = int(os.environ.get("ADV37B_N", "40"))
SEED = int(os.environ.get("ADV37B_SEED", "7"))
ENV = {"RECONCILER_FIRST_LOOK_MS": "500", "RECONCILER_POLL_MS": "200",
       "WORKER_LEASE_MS": "10000",
       "WORKER_UNKNOWN_RETRIES": os.environ.get("ADV37B_RETRIES", "3")}


def produce(s, cmds):
    s.produce_raw([{"key": c["payment_attempt_id"], "value": json.dumps(c)} for c in cmds])


def storm(new):
    rnd = random.Random(SEED)
    port = e2e.free_port()
    s = new("adv37b_storm", partitions=3, worker_env=ENV,
            psp_args=api.psp_webhook_args(port) + ["--latency-ms", "5",
                                                   "--latency-jitter-ms", "40"])
    api.start_api(s, port=port)
    workers = [s.start_worker(), s.start_worker()]
    auths = []
    for _ in range(N):
        a = e2e.new_command(amount=rnd.randint(500, 5000))
        a["type"] = "authorization.requested"
        auths.append(a)
    produce(s, auths)
    e2e.wait_until("the authorizations held", lambda: s.query(
        "SELECT count(*) FROM payment_attempts WHERE status = 'AUTHORIZED'") == [[str(N)]], 90)
    s.psp_put("/faults", {"latency_ms": 0, "rules": [
        {"kind": "drop_after", "probability": 0.15},
        {"kind": "error_after", "probability": 0.1},
        {"kind": "stall_after", "probability": 0.05}]})
    s.start_reconciler()
    steps = []
    for a in auths:
        cmds = []
        r = rnd.random()
        cid = str(uuid.uuid4())
        cap = {"type": "capture.requested", "version": 1, "capture_id": cid,
               "payment_attempt_id": a["payment_attempt_id"], "idempotency_key": "capture:" + cid}
        if rnd.random() < 0.5:
            cap["amount"] = rnd.randint(1, a["amount"])
        vid = str(uuid.uuid4())
        vd = {"type": "void.requested", "version": 1, "void_id": vid,
              "payment_attempt_id": a["payment_attempt_id"], "idempotency_key": "void:" + vid,
              "reason": "requested_by_customer"}
        if r < 0.35:
            cmds = [cap, vd, cap]
        elif r < 0.7:
            cmds = [vd, cap, vd]
        else:
            cmds = [cap, cap]
        steps.extend(cmds)
    rnd.shuffle(steps)
    half = len(steps) // 2
    produce(s, steps[:half])
    time.sleep(1.5)
    s.kill_worker(workers[0])
    produce(s, steps[half:])
    time.sleep(1.0)
    s.kill_worker(workers[1])
    s.start_worker()
    s.start_worker()
    time.sleep(3)
    s.psp_put("/faults", {}, method="DELETE")

    def quiet():
        return s.query("SELECT (SELECT count(*) FROM capture_attempts WHERE status IN"
                       " ('PENDING','PROCESSING','UNKNOWN')) + (SELECT count(*) FROM"
                       " void_attempts WHERE status IN ('PENDING','PROCESSING','UNKNOWN'))"
                       ) == [["0"]] and s.lag()["lag"] == 0
    e2e.wait_until("every step settled", quiet, 240, 1)
    time.sleep(2)
    led = s.psp_get("/ledger")
    caps = {}
    for c in led["captures"]:
        caps.setdefault(c["payment_intent_id"], []).append(c)
    cancels = {}
    for c in led["cancels"]:
        cancels.setdefault(c["payment_intent_id"], []).append(c)
    bad = []
    for a in auths:
        aid = a["payment_attempt_id"]
        st, ppid, captured = s.query(
            "SELECT status, provider_payment_id, coalesce(captured_amount, 0) FROM"
            " payment_attempts WHERE id = '%s'" % aid)[0]
        cs = dict((r[0], r[1:]) for r in s.query(
            "SELECT idempotency_key, status, coalesce(captured_amount, 0), coalesce(reason, '')"
            " FROM capture_attempts WHERE payment_attempt_id = '%s'" % aid))
        vs = dict((r[0], r[1:]) for r in s.query(
            "SELECT idempotency_key, status, coalesce(reason, '') FROM void_attempts"
            " WHERE payment_attempt_id = '%s'" % aid))
        booked = s.query("SELECT coalesce(sum(amount), 0) FROM ledger_entries WHERE"
                         " payment_attempt_id = '%s' AND kind = 'charge'" % aid)[0][0]
        pc, pv = caps.get(ppid, []), cancels.get(ppid, [])
        if pc and pv:
            bad.append((aid, "captured and canceled", pc, pv))
        for c in pc:
            mine = cs.get(c["idempotency_key"])
            if not mine or mine[0] != "SUCCEEDED" or int(mine[1]) != c["amount"] \
                    or st != "SUCCEEDED" or int(captured) != c["amount"] \
                    or int(booked) != c["amount"]:
                bad.append((aid, "captured %d under %s; ours %s, attempt %s captured %s,"
                            " booked %s" % (c["amount"], c["idempotency_key"], mine, st,
                                            captured, booked)))
        for v in pv:
            mine = vs.get(v.get("idempotency_key"))
            if not mine or mine[0] != "SUCCEEDED" or st != "VOIDED":
                bad.append((aid, "canceled under %s; ours %s, attempt %s"
                            % (v.get("idempotency_key"), mine, st)))
        for k, (cst, amt, why) in cs.items():
            if cst == "SUCCEEDED" and not any(c["idempotency_key"] == k for c in pc):
                bad.append((aid, "capture %s SUCCEEDED without psp-sim's capture" % k))
        for k, (vst, why) in vs.items():
            if vst == "SUCCEEDED" and not any(v.get("idempotency_key") == k for v in pv):
                bad.append((aid, "void %s SUCCEEDED without psp-sim's cancel" % k))
        if not pc and int(booked) != 0:
            bad.append((aid, "booked %s, nothing captured" % booked))
    e2e.log("captures", s.query("SELECT status, left(coalesce(reason,''),40), count(*) FROM"
                                " capture_attempts GROUP BY 1, 2 ORDER BY 1, 2"))
    e2e.log("voids", s.query("SELECT status, left(coalesce(reason,''),40), count(*) FROM"
                             " void_attempts GROUP BY 1, 2 ORDER BY 1, 2"))
    e2e.log("transitions", s.query("SELECT 'c', cause, new_status, count(*) FROM capture_transitions"
                                   " GROUP BY 1,2,3 UNION ALL SELECT 'v', cause, new_status,"
                                   " count(*) FROM void_transitions GROUP BY 1,2,3 ORDER BY 1,2,3"))
    e2e.log("psp", len(led["captures"]), "captures", len(led["cancels"]), "cancels")
    for b in bad:
        e2e.log("BAD", *[str(x) for x in b])
    check(not bad, "%d authorizations wrong: %s" % (len(bad), bad[:5]))


if __name__ == "__main__":
    raise SystemExit(e2e.main(e2e.run_scenarios([storm])))
