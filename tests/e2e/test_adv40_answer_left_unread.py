#!/usr/bin/env python3
"""Adversary 40: a provider answer read while other calls are out waits for
the loop's whole idle wait before it is collected (e38859b).

stripe_perform (the loop's one wait, engine_wait) first moves the transfers
forward (curl_multi_perform), which reads an answer that came while the
loop ran its stages and finishes its transfer; then, with calls still out
or a wake fd given, it waits in curl_multi_poll for up to the loop's idle
wait (up to 100 ms) for new activity. The answer it just finished is not
activity: it is collected (engine_collect_calls) only after the poll
returns, when another socket, a Kafka event or the timeout ends it. Before
e38859b the poll was at most 10 ms (engine_collect_calls(eng, 10)), and a
finished transfer was never followed by a poll with nothing running.

The break: 600 charges at 100/s, published twenty at a time every 200 ms,
psp-sim answering after 50-100 ms; the delay measured is from the end of
each charge's call (provider_calls.started_at + latency_ms) to its outcome
written (the outbox row's created_at, the persist's transaction). On main's
HEAD: p99 103-106 ms, max 107-110 ms, 11, 19 and 30 answers of 600 over
50 ms (3 runs; WORKER_BATCH_HOLD_MS 0 here, and 10 and 100 gave the same
p99 in a variant): the last answer of a burst waits for the next burst's
message or the 100 ms cap. The build before (0557824): p99 12 ms, max
15 ms, none over 50 ms (and p99 15-17 ms, none over 50 ms, in 3 runs of
smaller variants). The bound asserted: at most 2 over 50 ms. The cause
named above: with stripe_perform skipping its poll when a transfer had
finished (running < in_flight; tried, not committed) the same test gave
p99 6 ms, max 10 ms, none over 50 ms."""
import time

import charged_e2e as e2e
from charged_e2e import check

N, BURST, RATE = 600, 20, 100.0
LATE_MS = 50
MAX_LATE = 2


def scenario(new):
    s = new("adv40_answer_left_unread", partitions=6,
            psp_args=["--latency-ms", "50", "--latency-jitter-ms", "50"])
    w = s.start_worker(WORKER_BATCH_HOLD_MS=0)
    e2e.wait_until("worker ready", lambda: s.admin_get(w, "/readyz")[0] == 200, 60)
    for _ in range(N // BURST):
        s.publish([e2e.new_command() for _ in range(BURST)])
        time.sleep(BURST / RATE)
    s.wait_settled(N, 60)
    s.check_invariants()
    rows = s.query(
        "SELECT extract(epoch FROM o.created_at - (c.started_at + c.latency_ms *"
        " interval '1 ms')) * 1000 FROM outbox o JOIN provider_calls c"
        " USING (payment_attempt_id) WHERE c.operation = 'charge'")
    delays = sorted(float(r[0]) for r in rows)
    check(len(delays) == N, "outcomes with their charge call: %d of %d" % (len(delays), N))
    late = [d for d in delays if d > LATE_MS]
    e2e.log("answer -> persisted ms: p50 %.0f p99 %.0f max %.0f; over %d ms: %d"
            % (delays[N // 2], delays[N * 99 // 100], delays[-1], LATE_MS, len(late)))
    check(len(late) <= MAX_LATE,
          "%d of %d answers were persisted more than %d ms after they came (p99 %.0f ms, max "
          "%.0f ms): an answer curl_multi_perform finished in the loop's wait sat through "
          "its curl_multi_poll, up to the loop's 100 ms idle wait"
          % (len(late), N, LATE_MS, delays[N * 99 // 100], delays[-1]))


if __name__ == "__main__":
    raise SystemExit(e2e.main(scenario))
