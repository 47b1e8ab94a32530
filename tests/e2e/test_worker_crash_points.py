#!/usr/bin/env python3
"""Crash points: a worker is killed with SIGKILL (by a failpoint that only
CHARGED_FAILPOINT enables) right after claiming, right after the provider
charged but before persisting, and right after persisting but before the
offset commit. After a restart, each attempt ends SUCCEEDED with exactly one
charge at the provider, and every offset is committed."""
import charged_e2e as e2e
from charged_e2e import check, check_eq


def crash_at(new, failpoint):
    s = new("crash_" + failpoint)
    cmds = [e2e.new_command() for _ in range(3)]
    victim = s.start_worker(CHARGED_FAILPOINT=failpoint, WORKER_MAX_IN_FLIGHT=1)
    s.publish(cmds)
    rc = s.wait_worker_exit(victim, timeout=120)
    check(rc == -9, "worker was to die by SIGKILL at %s, exited %s" % (failpoint, rc))
    e2e.log(failpoint, ": worker died; attempts now",
            [a["status"] for a in s.attempts()], "charges", len(s.ledger()))
    s.start_worker()
    s.wait_settled(len(cmds), timeout=180)
    s.check_invariants()
    for c in cmds:
        rows = s.query("SELECT status FROM payment_attempts WHERE id = '%s'" % c["payment_attempt_id"])
        check_eq(rows, [["SUCCEEDED"]], "%s: status of attempt %s" % (
            failpoint, c["payment_attempt_id"]))
        charges = [x for x in s.ledger() if x["idempotency_key"] == c["idempotency_key"]]
        check(len(charges) == 1, "%s: key %s charged %d times, want once: %s" % (
            failpoint, c["idempotency_key"], len(charges), charges))
    s.close()


def scenario(new):
    for fp in ("after_claim", "after_charge", "after_persist"):
        crash_at(new, fp)


if __name__ == "__main__":
    raise SystemExit(e2e.main(scenario))
