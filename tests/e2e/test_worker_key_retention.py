#!/usr/bin/env python3
"""No provider call once the provider may have forgotten the key.

psp-sim forgets idempotency keys 3 s after their request executed, and the
worker is told so (WORKER_KEY_RETENTION_MS=3000). A first worker is killed
(failpoint after_charge) right after the provider charged, before anything
was persisted. A second worker takes the attempt over 5 s later, when its
lease (2 s) has long expired and the provider no longer knows the key: a
re-POST would be a second charge. It must not call; the attempt goes to
UNKNOWN (the reconciler looks the charge up), its lease released, with a
reason naming the key retention, and the message is committed."""
import os
import time

import charged_e2e as e2e
from charged_e2e import check, check_eq

ENV = {
    "WORKER_KEY_RETENTION_MS": 3000,
    "WORKER_LEASE_MS": 2000,
    "PROVIDER_TIMEOUT_MS": 1000,
    "WORKER_UNKNOWN_RETRIES": 0,
}


def log_tail(s, name):
    try:
        with open(os.path.join(s.dir, name + ".log"), "rb") as f:
            return f.read()[-1500:].decode(errors="replace")
    except OSError:
        return ""


def scenario(new):
    s = new("key_retention", psp_args=["--key-retention-ms", "3000"])
    cmd = e2e.new_command()
    aid, key = cmd["payment_attempt_id"], cmd["idempotency_key"]

    first = s.start_worker(CHARGED_FAILPOINT="after_charge", WORKER_MAX_IN_FLIGHT=1, **ENV)
    s.publish([cmd])
    try:
        rc = s.wait_worker_exit(first, timeout=60)
    except Exception:
        raise e2e.Failure("the first worker did not reach after_charge within %.0fs: %s"
                          % (e2e.scaled(60), log_tail(s, first))) from None
    died = time.monotonic()
    check(rc == -9, "the first worker was to die by SIGKILL at after_charge, exited %s "
          "(does it refuse these settings?): %s" % (rc, log_tail(s, first)))
    charges = [c for c in s.ledger() if c["idempotency_key"] == key]
    check(len(charges) == 1, "the provider was to charge once before the kill: %s" % charges)
    rows = s.query("SELECT status FROM payment_attempts WHERE id = '%s'" % aid)
    check(rows == [["PROCESSING"]], "nothing was to be persisted before the kill: %s" % rows)
    e2e.log("first worker died after the charge; key", key)

    # 5 s later: the lease (2 s) has expired and the provider forgot the key (3 s).
    e2e.wait_until("5s after the kill", lambda: time.monotonic() - died >= 5, 10, 0.05)
    second = s.start_worker(**ENV)

    def settled():
        p = s.workers.get(second)
        if p is not None and p.poll() is not None:
            raise e2e.Failure("the second worker exited %s: %s" % (
                p.returncode, log_tail(s, second)))
        rows = s.query("SELECT status, lease_owner IS NULL FROM payment_attempts "
                       "WHERE id = '%s'" % aid)
        return rows and rows[0][0] not in ("PENDING", "PROCESSING") and \
            s.lag()["lag"] == 0
    try:
        e2e.wait_until("the attempt settled and its offset committed", settled, 45, 0.3)
    except e2e.Failure as e:
        raise e2e.Failure("%s; attempt %s, lag %s, provider charges under the key %d" % (
            e, s.query("SELECT status, reason, lease_owner FROM payment_attempts "
                       "WHERE id = '%s'" % aid), s.lag()["lag"],
            len([c for c in s.ledger() if c["idempotency_key"] == key]))) from None
    charges = [c for c in s.ledger() if c["idempotency_key"] == key]
    check(len(charges) == 1,
          "the key was charged %d times: the second worker re-POSTed after the provider "
          "forgot the key: %s" % (len(charges), [(c["payment_intent_id"], c["at_ms"])
                                                  for c in charges]))

    rows = s.query("SELECT status, coalesce(reason, ''), lease_owner IS NULL, "
                   "coalesce(provider_payment_id, '') FROM payment_attempts "
                   "WHERE id = '%s'" % aid)
    check(len(rows) == 1, "want one row for attempt %s: %s" % (aid, rows))
    status, reason, released, ppid = rows[0]
    check(status == "UNKNOWN",
          "the attempt is %s (reason %r); with the key possibly forgotten it must be UNKNOWN, "
          "never SUCCEEDED without evidence nor FAILED" % (status, reason))
    check(released == "t", "the UNKNOWN attempt still holds a lease: %s" % rows)
    check("key_retention" in reason, "reason %r does not name the key retention" % reason)
    lag = s.lag()
    check_eq(lag["lag"], 0, "lag of the group (%s)" % lag)
    e2e.log("attempt", aid, status, repr(reason), "ppid", repr(ppid))


if __name__ == "__main__":
    raise SystemExit(e2e.main(scenario))
