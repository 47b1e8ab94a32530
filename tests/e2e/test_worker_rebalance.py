#!/usr/bin/env python3
"""Rebalance: two workers run 2,000 commands; a third joins mid-run and one
of the first two leaves by SIGTERM (exit status 0). Cooperative-sticky
rebalancing drains revoked partitions; the invariants hold."""
import charged_e2e as e2e

N = 2000


def settled(s):
    return int(s.query("SELECT count(*) FROM payment_attempts WHERE status IN "
                       "('SUCCEEDED', 'FAILED', 'UNKNOWN')")[0][0])


def scenario(new):
    s = new("rebalance", psp_args=[
        "--seed", "3", "--latency-ms", "20", "--latency-jitter-ms", "20",
        "--fault", "drop_after=0.05"])
    cmds = [e2e.new_command() for _ in range(N)]
    first = s.start_worker()
    s.start_worker()
    s.publish(cmds)
    e2e.wait_until("a quarter settled", lambda: settled(s) >= N // 4, 300)
    s.start_worker()
    e2e.wait_until("half settled", lambda: settled(s) >= N // 2, 300)
    rc = s.kill_worker(first, e2e.signal.SIGTERM)
    assert rc == 0, "worker left by SIGTERM with status %s" % rc
    s.wait_settled(N, timeout=600)
    s.check_invariants()


if __name__ == "__main__":
    raise SystemExit(e2e.main(scenario))
