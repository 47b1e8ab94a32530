#!/usr/bin/env python3
"""Worker throughput under provider latency, against a baseline run in the
same invocation: N commands through one worker, first with an instant
provider (the baseline), then with 100 ms of provider latency and
WORKER_MAX_IN_FLIGHT large enough to keep N calls in flight. With a design
that keeps calls in flight concurrently, the slow run stays close to the
baseline; a design that calls one at a time would be N x 100 ms slower.

Needs the test stack: CHARGED_TEST_DATABASE_URL, CHARGED_TEST_KAFKA
(tools/run-all-tests.sh prints how it starts it; deploy/stack.sh up and
eval "$(deploy/stack.sh env)" work too, with those two variables set from
DATABASE_URL and KAFKA_BOOTSTRAP_SERVERS).

  python3 bench/worker_throughput.py [N]
"""
import os
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "tests", "e2e"))
import charged_e2e as e2e  # noqa: E402


def run(new, label, n, latency_ms, in_flight):
    s = new("bench_" + label, psp_args=["--latency-ms", str(latency_ms)])
    cmds = [e2e.new_command() for _ in range(n)]
    s.publish(cmds)  # published first: the clock measures the worker only
    t0 = time.monotonic()
    s.start_worker(WORKER_MAX_IN_FLIGHT=in_flight, LOG_LEVEL="warn")
    s.wait_settled(n, timeout=900)
    elapsed = time.monotonic() - t0
    s.check_invariants()
    s.close()
    return elapsed


def main(new):
    n = int(sys.argv[1]) if len(sys.argv) > 1 else 2000
    base = run(new, "baseline", n, 0, n)
    slow = run(new, "latency100", n, 100, n)
    print("commands: %d, one worker" % n)
    print("baseline, provider instant, %d in flight: %.1f s, %.0f attempts/s" % (n, base, n / base))
    print("provider 100 ms, %d in flight:           %.1f s, %.0f attempts/s" % (n, slow, n / slow))
    print("ratio slow/baseline time: %.2f (one call at a time would take %.0f s)" %
          (slow / base, n * 0.1))


if __name__ == "__main__":
    sys.exit(e2e.main(main))
