#!/usr/bin/env python3
"""A partition revoked while its provider call is in flight.

w1 (WORKER_MAX_IN_FLIGHT=2) holds one call on each of the two partitions,
held at psp-sim by SIGSTOP. w2 joins; w1 drains the partition it loses
(P) for REBALANCE_DRAIN_MS (1 s), which passes with the call still out,
and gives it up. w2 then consumes P from its start: the attempt whose call
w1 still has out (A_P), and a sentinel behind it, another attempt of
A_P's order, which the record step rejects (the order has a live attempt)
without any call. Once the sentinel is REJECTED, w2 has tried to claim
A_P (the same batch, or an earlier one). With the sentinel, a command B
goes to the partition w1 kept. Then psp-sim goes on; each charge takes
3 s there (--latency-ms), so a second request with A_P's key meanwhile
is answered 409 idempotency_key_in_use, and a request sent meanwhile
overlaps the two calls w1 had out.

The call in flight keeps its lease: w2 must not claim A_P and send under
its key while w1's call is out (psp-sim answers no 409, its counters
say), and w1 persists the answer it gets (no "result dropped"). The call
w1 still has out on P takes its slot until it ends: psp-sim never sees
more than WORKER_MAX_IN_FLIGHT (2) charge requests at once (w2 sends none
here), so w1 starts B only once one of its calls is done. Every attempt
is charged exactly once (psp-sim's ledger), the invariants hold.
"""
import json
import zlib

import charged_e2e as e2e
from charged_e2e import check, check_eq

PARTITIONS = 2
LATENCY_MS = 3000
MAX_IN_FLIGHT = 2
ENV = {
    "WORKER_MAX_IN_FLIGHT": str(MAX_IN_FLIGHT),
    "REBALANCE_DRAIN_MS": "1000",
    # The calls are held for seconds: they must not time out meanwhile.
    "PROVIDER_TIMEOUT_MS": "20000",
    "WORKER_UNKNOWN_RETRIES": "0",
    "WORKER_LEASE_MS": "30000",
}


def command_on(partition, **fields):
    """A command whose key (its payment_attempt_id) the producer's default
    partitioner (CRC32 of the key, modulo the partitions) puts on partition."""
    while True:
        c = e2e.new_command(**fields)
        if zlib.crc32(c["payment_attempt_id"].encode()) % PARTITIONS == partition:
            return c


def partitions_of(s):
    """{payment_attempt_id: partition} of the commands topic."""
    out = {}
    for line in s.tool("dump", s.topics["commands"]).splitlines():
        if line.strip():
            m = json.loads(line)
            out[m["key"]] = m["partition"]
    return out


def publish_on(s, placed):
    """Publishes [(command, partition)] and checks each landed there."""
    s.publish([c for c, _ in placed])
    where = partitions_of(s)
    for c, p in placed:
        check_eq(where.get(c["payment_attempt_id"]), p,
                 "partition of command %s" % c["payment_attempt_id"])


def in_flight(s, name):
    return s.admin_metrics(name).get("charged_provider_calls_in_flight", 0)


def logged(s, name, msg, **fields):
    return [l for l in s.worker_log(name, msg)
            if all(l.get(k) == v for k, v in fields.items())]


def scenario(new):
    s = new("revoke_in_flight", partitions=PARTITIONS,
            psp_args=["--latency-ms", str(LATENCY_MS)], worker_env=ENV)
    w1 = s.start_worker()
    e2e.wait_until("w1 ready", lambda: s.admin_get(w1, "/readyz")[0] == 200, 60)
    a = [command_on(p) for p in range(PARTITIONS)]
    s.psp_freeze()
    publish_on(s, [(a[p], p) for p in range(PARTITIONS)])
    e2e.wait_until("w1's two calls in flight", lambda: in_flight(s, w1) == 2, 30, 0.05)

    w2 = s.start_worker()
    drained = e2e.wait_until("w1 giving up the partition it lost", lambda: logged(
        s, w1, "revoked partitions drained"), 60, 0.05)[0]
    check_eq(drained.get("count"), "1", "partitions w1 gave up")
    lost = int(drained["partitions"])
    check(logged(s, w1, "drain deadline passed"),
          "w1 gave partition %d up without its drain deadline passing: its call was not "
          "in flight" % lost)
    e2e.wait_until("w2 assigned partition %d" % lost, lambda: logged(
        s, w2, "partitions assigned", partitions=str(lost)), 60, 0.05)
    held = a[lost]
    sentinel = command_on(lost, order_id=held["order_id"])
    kept = command_on(1 - lost)
    publish_on(s, [(sentinel, lost), (kept, 1 - lost)])
    e2e.wait_until("w2 rejecting the sentinel", lambda: s.query(
        "SELECT status FROM payment_attempts WHERE id = '%s'"
        % sentinel["payment_attempt_id"]) == [["REJECTED"]], 60, 0.05)
    s.psp_thaw()

    s.wait_settled(len(a) + 2, timeout=60)
    s.check_invariants()
    counters = s.psp_get("/ledger")["counters"]
    e2e.log("psp-sim counters:", counters)
    check_eq(counters["in_use_409"], 0,
             "psp-sim's 409 idempotency_key_in_use answers (a second owner sent under a "
             "key whose call was still in flight)")
    check_eq(logged(s, w1, "lease lost before persisting"), [],
             "w1's answers dropped for a lost lease")
    check(counters["max_charges_in_flight"] <= MAX_IN_FLIGHT,
          "psp-sim saw %d charge requests at once from w1 (WORKER_MAX_IN_FLIGHT=%d): the "
          "call it still had out on the revoked partition did not keep its slot"
          % (counters["max_charges_in_flight"], MAX_IN_FLIGHT))
    for c in a + [kept]:
        charges = [x for x in s.ledger() if x["idempotency_key"] == c["idempotency_key"]]
        check_eq(len(charges), 1, "charges of attempt %s" % c["payment_attempt_id"])
    actors = s.query("SELECT actor FROM attempt_transitions WHERE payment_attempt_id = "
                     "'%s' AND new_status = 'SUCCEEDED'" % held["payment_attempt_id"])
    check_eq(actors, [[s.worker_ids[w1]]],
             "who settled the attempt whose call was in flight at the revocation")


if __name__ == "__main__":
    raise SystemExit(e2e.main(scenario))
