#!/usr/bin/env python3
"""Adversary 38k: waiting jobs that come due together break
WORKER_MAX_IN_FLIGHT.

1eaef27 takes JOB_WAIT out of the in-flight slots: a waiting job claims
again only while engine_core_started() is below max_in_flight
(engine_core_claim_gate). But engine_claim_attempts asks the gate of every
due waiting job before any of them is claimed: the gate's count does not
grow within the batch, so with one slot free every due waiting job passes,
all are claimed in one statement, and engine_start_calls sends them all.

The break: attempts whose records another worker left leased (it died
right after claiming them: CHARGED_FAILPOINT=after_claim) wait in a worker
of WORKER_MAX_IN_FLIGHT 4 (BUSY, then JOB_WAIT) while 4 other charges'
calls fill its 4 slots (psp-sim answering after 4-6 s). The dead worker's
leases end (the test expires them), and the 4 waiting jobs come due but
find no slot. The first call answered frees one: the 4 waiting ones are
claimed in one batch and called at once, beside the 3 calls still out:
psp-sim sees 7 charges in flight from a worker of WORKER_MAX_IN_FLIGHT 4.
(Before 1eaef27 a waiting job held its slot: at most 4.) Money stays
safe: each attempt is charged once."""
import charged_e2e as e2e
from charged_e2e import check, check_eq

MAX_IN_FLIGHT = 4
GHOSTS = 4


def in_flight(s):
    return s.psp_get("/ledger")["counters"]["charges_in_flight"]


def scenario(new):
    s = new("adv38k_wait_burst", partitions=1)
    ghosts = [e2e.new_command(amount=100 + i) for i in range(GHOSTS)]
    s.publish(ghosts)
    # A worker of another group records and claims the four, then dies
    # before calling: their rows stay leased to it.
    dying = s.start_worker(CHARGED_FAILPOINT="after_claim", KAFKA_GROUP_ID=s.group + "-dying",
                           WORKER_MAX_IN_FLIGHT=16, WORKER_LEASE_MS=60000)
    rc = s.wait_worker_exit(dying, 60)
    check(rc == -9, "the first worker was to die by SIGKILL after its claim, exited %s" % rc)
    ids = ",".join("'%s'" % c["payment_attempt_id"] for c in ghosts)
    leased = int(s.query("SELECT count(*) FROM payment_attempts WHERE id IN (%s) AND"
                         " lease_owner = '%s'" % (ids, s.worker_ids[dying]))[0][0])
    check_eq(leased, GHOSTS, "attempts the dead worker left leased (setup)")
    check_eq(s.psp_get("/ledger")["counters"]["max_charges_in_flight"], 0,
             "psp-sim calls before the second worker (setup)")

    w = s.start_worker(WORKER_MAX_IN_FLIGHT=MAX_IN_FLIGHT, PROVIDER_TIMEOUT_MS=20000,
                       WORKER_UNKNOWN_RETRIES=0, WORKER_LEASE_MS=30000,
                       WORKER_RECHECK_MS=100)
    # The four wait (their records leased by the dead worker); four other
    # charges fill the slots, the first answered 2 s before the others.
    s.psp_put("/faults", {"latency_ms": 4000})
    first = e2e.new_command(amount=500)
    s.publish([first])
    e2e.wait_until("the first blocking call out", lambda: in_flight(s) == 1, 30, 0.05)
    s.psp_put("/faults", {"latency_ms": 6000})
    s.publish([e2e.new_command(amount=501 + i) for i in range(MAX_IN_FLIGHT - 1)])
    e2e.wait_until("every slot's call out", lambda: in_flight(s) == MAX_IN_FLIGHT, 30, 0.05)
    waiting = int(s.query("SELECT count(*) FROM payment_attempts WHERE id IN (%s) AND"
                          " lease_owner = '%s'" % (ids, s.worker_ids[dying]))[0][0])
    check_eq(waiting, GHOSTS, "attempts still leased to the dead worker (setup)")
    # The dead worker's leases end: the four are due, no slot is free.
    s.psp_put("/faults", {"latency_ms": 3000})
    s.query("UPDATE payment_attempts SET lease_expires_at = now() WHERE id IN (%s)"
                " RETURNING id" % ids)
    s.wait_settled(GHOSTS + MAX_IN_FLIGHT, 40)
    s.check_invariants()
    for c in ghosts:
        n = len([x for x in s.ledger() if x["idempotency_key"] == c["idempotency_key"]])
        check_eq(n, 1, "charges of attempt %s" % c["payment_attempt_id"])
    counters = s.psp_get("/ledger")["counters"]
    e2e.log("psp-sim counters:", counters)
    check(counters["max_charges_in_flight"] <= MAX_IN_FLIGHT,
          "psp-sim saw %d charges in flight at once from one worker of WORKER_MAX_IN_FLIGHT "
          "%d: %d waiting jobs came due with no slot free, and all were claimed and called "
          "together when one slot freed (engine_core_claim_gate counts the started jobs "
          "before any of the batch is claimed)"
          % (counters["max_charges_in_flight"], MAX_IN_FLIGHT, GHOSTS))


if __name__ == "__main__":
    raise SystemExit(e2e.main(scenario))
