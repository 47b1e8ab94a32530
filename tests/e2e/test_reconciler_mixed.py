#!/usr/bin/env python3
"""The reconciler after a mixed-fault run: 2,000 commands through two
workers (one sends an unknown answer to the reconciler at once,
WORKER_UNKNOWN_RETRIES=0; the other retries 3 times first); psp-sim drops
10% of answers after executing, answers 500 after executing for 5% and
before executing for 5%, holds 2% of answers past the client's timeout
(stall 3 s, PROVIDER_TIMEOUT_MS 1 s), declines 2%, with 5-20 ms latency.
Once the workers are done, one reconciler with a fast schedule settles what
they left. Then: no attempt UNKNOWN or PROCESSING; every attempt psp-sim
charged is SUCCEEDED; none FAILED but the declined ones; no key charged
twice (check_invariants); no status entered twice by the reconciler, one
ledger row at most and no event type twice per attempt. Reports how many
the reconciler settled, by search and by charging again (replayed or first
executed), and the time it took."""
import time

import charged_e2e as e2e
from charged_e2e import check, check_eq

N = 2000
COMMON = {  # worker_env: strings, as the environment holds them
    "PROVIDER_TIMEOUT_MS": "1000",
    "RECONCILER_FIRST_LOOK_MS": "0",
}


def count(s, sql):
    return int(s.query(sql)[0][0])


def scenario(new):
    s = new("rec_mixed", worker_env=COMMON, psp_args=[
        "--seed", "23", "--latency-ms", "5", "--latency-jitter-ms", "15", "--stall-ms", "3000",
        "--fault", "drop_after=0.10", "--fault", "error_after=0.05",
        "--fault", "error_before=0.05", "--fault", "stall_after=0.02"])
    cmds = [e2e.new_command(payment_method="pm_card_chargeDeclined" if i % 50 == 7
                            else "pm_card_visa") for i in range(N)]
    declined = {c["payment_attempt_id"] for c in cmds if c["payment_method"] != "pm_card_visa"}
    t0 = time.monotonic()
    s.start_worker(WORKER_UNKNOWN_RETRIES=0, WORKER_LEASE_MS=5000)
    s.start_worker()  # the scenario's default: 3 retries with the same key
    s.publish(cmds)
    s.wait_settled(N, timeout=240)
    workers_done = time.monotonic()
    left = dict((r[0], int(r[1])) for r in s.query(
        "SELECT status, count(*) FROM payment_attempts WHERE status IN "
        "('UNKNOWN', 'PROCESSING') GROUP BY 1"))
    e2e.log("workers done in %.1fs; left for the reconciler: %s" % (workers_done - t0, left))
    check(left.get("UNKNOWN", 0) > 0, "the workers left nothing UNKNOWN: the faults did not bite")

    r = s.start_reconciler(RECONCILER_SCHEDULE_MS=200, RECONCILER_POLL_MS=100,
                           RECONCILER_BATCH=64)

    def none_open():
        gone = [x for x in s.reconcilers.items() if x[1].poll() is not None]
        check(not gone, "the reconciler exited: %s" % [(n, p.returncode) for n, p in gone])
        return count(s, "SELECT count(*) FROM payment_attempts "
                        "WHERE status IN ('UNKNOWN', 'PROCESSING')") == 0
    e2e.wait_until("no attempt UNKNOWN or PROCESSING", none_open, 120, 0.3)
    done = time.monotonic()
    check_eq(s.stop_reconciler(r), 0, "exit status of the reconciler after SIGTERM")

    counts = s.check_invariants()
    check_eq(counts.get("UNKNOWN", 0) + counts.get("PROCESSING", 0), 0, "open attempts")
    attempts = {a["id"]: a for a in s.attempts()}
    ledger = s.ledger()
    charged = [c for c in ledger if c["outcome"] == "succeeded"]
    bad = [(c["payment_attempt_id"], attempts.get(c["payment_attempt_id"], {}).get("status"))
           for c in charged if attempts.get(c["payment_attempt_id"], {}).get("status")
           != "SUCCEEDED"]
    check(not bad, "attempts psp-sim charged that are not SUCCEEDED: %s" % bad[:10])
    failed = [a for a in attempts.values() if a["status"] == "FAILED"]
    wrong = [(a["id"], a["reason"]) for a in failed if a["id"] not in declined]
    check(not wrong, "FAILED attempts that were not declined: %s" % wrong[:10])
    check_eq(counts.get("SUCCEEDED", 0), N - len(declined), "SUCCEEDED attempts")
    check_eq(s.query("SELECT payment_attempt_id, new_status FROM attempt_transitions "
                     "WHERE cause = 'reconciler' GROUP BY 1, 2 HAVING count(*) > 1"), [],
             "(attempt, status) entered more than once by the reconciler")
    check_eq(s.query("SELECT payment_attempt_id FROM ledger_entries "
                     "GROUP BY 1 HAVING count(*) > 1"), [], "attempts with two ledger rows")
    check_eq(s.query("SELECT payment_attempt_id, event_type FROM outbox "
                     "GROUP BY 1, 2 HAVING count(*) > 1"), [], "attempts with an event twice")
    check_eq(count(s, "SELECT count(*) FROM payment_attempts p WHERE status = 'SUCCEEDED' AND "
                      "NOT EXISTS (SELECT 1 FROM ledger_entries l "
                      "WHERE l.payment_attempt_id = p.id)"), 0,
             "SUCCEEDED attempts without a ledger row")

    # What the reconciler did, from its settling transitions' evidence and its calls.
    settled = s.query(
        "SELECT new_status, jsonb_path_exists(evidence, '$.calls[*] ? (@.operation == \"charge\")'), "
        "count(*) FROM attempt_transitions WHERE cause = 'reconciler' GROUP BY 1, 2")
    by = {}
    for status, charged_again, n in settled:
        key = (status, "charged again" if charged_again == "t" else "looked up")
        by[key] = by.get(key, 0) + int(n)
    total = sum(by.values())
    check_eq(total, left.get("UNKNOWN", 0) + left.get("PROCESSING", 0),
             "attempts the reconciler settled (%s)" % by)
    rcharges = dict(((r_[0], r_[1]), int(r_[2])) for r_ in s.query(
        "SELECT outcome, replayed::text, count(*) FROM provider_calls "
        "WHERE operation = 'charge' AND actor = '%s' GROUP BY 1, 2" % s.worker_ids[r]))
    looks = dict((r_[0], int(r_[1])) for r_ in s.query(
        "SELECT operation, count(*) FROM provider_calls WHERE actor = '%s' GROUP BY 1"
        % s.worker_ids[r]))
    e2e.log("reconciler settled %d attempts in %.1fs (whole run %.1fs): %s" % (
        total, done - workers_done, done - t0,
        ", ".join("%s %s: %d" % (k[0], k[1], v) for k, v in sorted(by.items()))))
    e2e.log("reconciler calls: %s; its charges (outcome, replayed): %s; psp-sim counters %s"
            % (looks, rcharges, s.psp_get("/ledger")["counters"]))


if __name__ == "__main__":
    raise SystemExit(e2e.main(scenario))
