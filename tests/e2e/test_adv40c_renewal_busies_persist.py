#!/usr/bin/env python3
"""Adversary 40c: the worker's own lease renewal makes its own persists
"busy": outcomes wait a back-off for a lock no other session holds.

182ba31 says renewals and waits name their jobs by copied id and claim
epoch "so no job waits for them". But the renewal statement
(SQL_LEASE_RENEW, on the upkeep lane's session) locks every claimed row it
renews (FOR NO KEY UPDATE ... SKIP LOCKED) for as long as it runs, and an
outcome persisted meanwhile on the persist lane's session (SQL_PERSIST,
SKIP LOCKED too) finds its row held: ENGINE_NEXT_BUSY, "attempt locked by
another session; persisting it again shortly", and the job waits a
back-off. Only jobs a lane holds (in_lane) are left out of the renewal, not
jobs that go to the persist lane while it runs. Before the lanes both ran
on one session, one after the other: never busy.

Measured: 1,500 charges in bursts of 100 every 200 ms, psp-sim answering in
0.5-2 s, WORKER_MAX_IN_FLIGHT=2000, WORKER_LEASE_MS=3000 (a renewal every
second, of up to ~1,000 rows). No session but the worker's touches the
attempts. On main's HEAD (182ba31): 15, 10, 7, 12 and 4 persists busy (5 runs);
answer -> persisted p99 60-80 ms, the busy ones 42-86 ms (all: p50 10 ms).
WORKER_LEASE_MS=120000 (no renewal in the run): none busy, p99 28 ms. The
build before the lanes (0c9ff1d), this test as it is: none busy."""
import time

import charged_e2e as e2e
from charged_e2e import check

N, BURST = 1500, 100


def scenario(new):
    s = new("adv40c_renewal_busies_persist", partitions=6,
            psp_args=["--latency-ms", "500", "--latency-jitter-ms", "1500"])
    w = s.start_worker(WORKER_LEASE_MS=3000, PROVIDER_TIMEOUT_MS=2500,
                       WORKER_UNKNOWN_RETRIES=0, WORKER_MAX_IN_FLIGHT=2000)
    e2e.wait_until("worker ready", lambda: s.admin_get(w, "/readyz")[0] == 200, 60)
    for _ in range(N // BURST):
        s.publish([e2e.new_command() for _ in range(BURST)])
        time.sleep(0.2)
    s.wait_settled(N, 120)
    s.check_invariants()
    busy = s.worker_log(w, "attempt locked by another session")
    renewed = s.worker_log(w, "lease lost")
    e2e.log("persists found busy: %d (no other session holds a row); leases lost: %d"
            % (len(busy), len(renewed)))
    check(not busy,
          "%d outcomes were found busy and waited a back-off, though no session but the "
          "worker's touched the attempts: its own renewal (upkeep lane) held their rows "
          "while the persist lane wrote them" % len(busy))


if __name__ == "__main__":
    raise SystemExit(e2e.main(scenario))
