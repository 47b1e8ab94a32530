#!/usr/bin/env python3
"""Adversary 38f, break: commands held back by the worker's own 429 pace
say nothing on their records, for as long as they wait. docs/states.md
("Waiting: queued, not failed"): "A claimed command the worker cannot send
yet is pending, not failed ... once it has waited about a second its record
says why" (issue 38: "Latency is honest").

engine_start_calls stops at the pace (provider_pace_next_ms > now) before a
job asks the budget, so no job held there ever gets provider_budget; and
provider_throttled is decided only when a 429 comes back
(engine_core_wait_answered): a job parked by a short back-off and then held
at the pace gets no answer, so it is never said either. Once psp-sim's
429s have cut the pace, nearly every claimed command waits there, for
tens of seconds, with waiting_reason NULL: `chargectl attempt show` and the
status API read it as an ordinary PROCESSING, a call possibly out.

One worker, no budget set, psp-sim limited to 5 req/s (100 ms latency),
300 charges: 10 s after they were published the claimed PROCESSING
attempts without a waiting_reason must be only the calls out (a handful:
5/s at 100 ms)."""
import time

import charged_e2e as e2e
from charged_e2e import check

N = 300
WAIT_S = 10
# The calls out and the jobs in a short park after a 429 of their own
# (under a second: docs/states.md says it only after one): a handful to a
# dozen as the pace sits a little over psp-sim's 5/s; the break left 250.
CALLS_OUT = 15


def scenario(new):
    s = new("adv38f_paced", partitions=4,
            psp_args=["--rate-limit", "5", "--latency-ms", "100"])
    w = s.start_worker()
    s.wait_group_settled([w])
    cmds = [e2e.new_command(amount=100 + i) for i in range(N)]
    t0 = time.time()
    s.publish(cmds)
    e2e.wait_until("the pace cut by a 429", lambda: s.worker_log(
        w, "throttled by the provider"), e2e.scaled(30), 0.2)
    # Every command still claimed then has waited that long for its call.
    time.sleep(max(0.0, t0 + WAIT_S - time.time()))
    rows = s.query("SELECT coalesce(waiting_reason, '-'), count(*) FROM payment_attempts"
                   " WHERE status = 'PROCESSING' AND lease_owner IS NOT NULL GROUP BY 1")
    by = dict((r[0], int(r[1])) for r in rows)
    silent = by.get("-", 0)
    one = s.query("SELECT id FROM payment_attempts WHERE status = 'PROCESSING' AND"
                  " lease_owner IS NOT NULL AND waiting_reason IS NULL LIMIT 1")
    if one:
        p = s.run([e2e.CHARGECTL, "attempt", "show", one[0][0]], check=False)
        e2e.log("chargectl attempt show of one:", p.stdout.decode()[:600])
    paces = [l.get("pace_per_s") for l in s.worker_log(w, "throttled by the provider")]
    done = int(s.query("SELECT count(*) FROM payment_attempts WHERE status = 'SUCCEEDED'")[0][0])
    e2e.log("claimed PROCESSING by waiting_reason:", by, "succeeded:", done,
            "pace at the last 429s:", paces[-3:])
    check(silent <= CALLS_OUT,
          "%d s after %d charges were published (%d succeeded), %d claimed PROCESSING "
          "attempts show no waiting_reason (%s): held back by the worker's 429 pace, they "
          "never asked the budget and got no 429 of their own, so nothing says they are "
          "queued" % (WAIT_S, N, done, silent, by))


if __name__ == "__main__":
    raise SystemExit(e2e.main(scenario))
