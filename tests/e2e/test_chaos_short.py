#!/usr/bin/env python3
"""tools/chaos, shortened: seed 1, 1,500 commands, the whole fleet, every
fault kind, at least 20 SIGKILLs. The run must pass its own verdict, and
the run's evidence must show that what the verdict judged did happen: the
kills (every role among them), the broker kill, PostgreSQL's immediate
stop, the backends terminated, every psp-sim fault kind fired, webhooks
duplicated and reordered, every kind of command (authorizations,
captures and voids among them) and every dead-letter
reason in the workload, and the other client's objects naming ours:
declined and succeeded charges, refunds on our charges' intents and on
its own, failed ones among them, some aimed at attempts in flight or with
their answer lost. psp-sim's restart is required only when psp-sim has
--state-file."""
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time

import charged_e2e as e2e
from charged_e2e import check, check_eq

HERE = os.path.dirname(os.path.abspath(__file__))
CHAOS = os.path.join(HERE, "..", "..", "tools", "chaos")
ROLES = ("worker", "reconciler", "relay", "api", "auditor", "order_service")
PSP_FAULTS = ("error_before", "error_after", "drop_after", "stall_after", "rate_limit")
KINDS = ("charge", "duplicate", "same_key_resend", "conflict", "second_attempt", "poison",
         "refund_partial", "refund_full", "refund_over", "refund_duplicate", "conflict_refund",
         "refund_not_refundable", "authorization", "capture_full", "capture_partial",
         "capture_in_flight", "capture_racing_void", "void", "void_racing_capture")
REASONS = ("malformed_json", "schema_violation", "key_mismatch", "card_data_refused",
           "invalid_utf8", "empty_value", "oversized", "amount_over_limit",
           "currency_not_allowed", "idempotency_key_conflict")


def scenario(new):
    e2e.stack_check()
    run_dir = tempfile.mkdtemp(prefix="chaos-short-", dir=os.path.join(e2e.BUILD))
    t0 = time.monotonic()
    # Authorizations, captures and voids mixed in at the runner's default share.
    p = subprocess.run([sys.executable, CHAOS, "--seed", "1", "--count", "1500",
                        "--keep", run_dir],
                       stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                       timeout=e2e.scaled(900))
    out = p.stdout.decode()
    with open(os.path.join(run_dir, "chaos.out"), "w") as f:
        f.write(out)
    e2e.log("tools/chaos took %.0fs; its output is in %s/chaos.out" % (
        time.monotonic() - t0, run_dir))
    table = out[out.find("== chaos verdict =="):]
    print(table)
    check_eq(p.returncode, 0, "tools/chaos exit status (see the table above)")
    check("verdict: PASS" in out and "repro: tools/chaos --seed 1 --count 1500" in out,
          "the run printed no passing verdict and repro line")
    with open(os.path.join(run_dir, "run.json")) as f:
        meta = json.load(f)
    with open(os.path.join(run_dir, "verdict.json")) as f:
        v = json.load(f)
    check_eq([r["row"] for r in v["rows"] if r["violation"]], [], "violated rows")
    kills = meta["kills"]
    check(len(kills) >= 20, "only %d SIGKILLs" % len(kills))
    check_eq(sorted({k[0] for k in kills}), sorted(ROLES), "roles SIGKILLed")
    actions = [f["action"] for f in meta["stack_faults"]]
    for a in ("broker", "postgres", "pg_terminate"):
        check(a in actions, "no %s fault in %s" % (a, actions))
    check(all(isinstance(f["arg"], int) and f["arg"] > 0 for f in meta["stack_faults"]
              if f["action"] == "pg_terminate"),
          "a pg_terminate_backend that terminated nothing: %s" % meta["stack_faults"])
    if meta["state_file"]:
        check("psp" in actions, "psp-sim has --state-file but was not restarted")
    fired = {h["kind"] for h in meta["psp_faults"]["hits"]}
    check_eq(sorted(set(PSP_FAULTS) - fired), [], "psp-sim fault kinds that never fired")
    wh = meta["psp_webhooks"]
    check(wh["duplicates"] > 0 and wh["reordered"] > 0, "webhooks: %s" % wh)
    kinds = v["facts"]["records by kind"]
    check_eq(sorted(k for k in KINDS if not kinds.get(k)), [], "command kinds never published")
    reasons = {r["row"].split()[2]: r["note"] for r in v["rows"]
               if r["row"].startswith("dead letters ") and r["row"].endswith(" missing")}
    check_eq(sorted(x for x in REASONS if reasons.get(x, "of 0 expected") == "of 0 expected"),
             [], "dead-letter reasons the workload never expected")
    facts = v["facts"]
    charges = facts["other client: charges by outcome"]
    check(charges.get("declined") and charges.get("succeeded"),
          "the other client's charges: %s" % charges)
    check(facts["other client: refunds by status"].get("failed"),
          "the other client's refunds: %s" % facts["other client: refunds by status"])
    with open(os.path.join(run_dir, "foreign.jsonl")) as f:
        made = [d for d in map(json.loads, f) if "object" in d]
    on = {d["on"] for d in made if d["object"] == "refund"}
    check_eq(sorted(on), ["its own", "ours"], "intents the other client's refunds were on")
    aims = facts["other client: aimed at"]
    check(aims.get("held") and aims.get("published")
          and (aims.get("processing") or aims.get("unknown")),
          "the other client aimed at: %s" % aims)
    e2e.log("chaos short run passed: %d kills %s, stack faults %s, psp faults %s, other "
            "client %s %s" % (len(kills), facts["SIGKILLs by role"], actions,
                              facts["psp faults fired"], charges,
                              facts["other client: refunds by status"]))
    shutil.rmtree(run_dir)  # kept only when the test fails


if __name__ == "__main__":
    raise SystemExit(e2e.main(scenario))
