#!/usr/bin/env python3
"""The provider breaker under partial degradation, against a baseline run in
the same invocation: N commands through one worker while psp-sim (same
seed both times) answers 10% of charges 5xx before executing and 10% after.
The baseline runs with the breaker off (PROVIDER_BREAKER_FAILURE_RATE=0);
the measured run with the default breaker. A breaker that tells degradation
from an outage keeps close to the baseline and opens 0 times; the streak
breaker of earlier versions (4 failures in a row) settled 3,000 charges at
36/s against 1,093/s with it off here.

Needs the test stack: CHARGED_TEST_DATABASE_URL, CHARGED_TEST_KAFKA (see
bench/worker_throughput.py).

  python3 bench/breaker_degraded.py [N]
"""
import os
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "tests", "e2e"))
import charged_e2e as e2e  # noqa: E402

FAULTS = ["--seed", "20261201", "--fault", "error_before=0.1", "--fault", "error_after=0.1"]


def run(new, label, n, breaker_env):
    s = new("bench_" + label, psp_args=FAULTS)
    cmds = [e2e.new_command() for _ in range(n)]
    s.publish(cmds)  # published first: the clock measures the worker only
    t0 = time.monotonic()
    w = s.start_worker(LOG_LEVEL="info", **breaker_env)
    s.wait_settled(n, timeout=1800)
    elapsed = time.monotonic() - t0
    opens = len(s.worker_log(w, "provider breaker opened: "))
    s.check_invariants()
    s.close()
    return elapsed, opens


def main(new):
    n = int(sys.argv[1]) if len(sys.argv) > 1 else 3000
    off, _ = run(new, "breaker_off", n, {"PROVIDER_BREAKER_FAILURE_RATE": "0"})
    on, opens = run(new, "breaker_default", n, {})
    print("commands: %d, one worker, 20%% of charges answered 5xx (10%% before, 10%% after "
          "executing)" % n)
    print("baseline, breaker off:  %.1f s, %.0f attempts/s" % (off, n / off))
    print("default breaker:        %.1f s, %.0f attempts/s, opened %d times" % (on, n / on, opens))
    print("ratio default/off rate: %.2f" % (off / on))


if __name__ == "__main__":
    sys.exit(e2e.main(main))
