#!/usr/bin/env python3
"""Random kills: during a 2,000-command run with provider faults, a random
worker is killed with SIGKILL at least five times and restarted. The
invariants hold: no key charged twice, SUCCEEDED matches the provider's
ledger, nothing FAILED was charged, every offset committed."""
import random
import time

import charged_e2e as e2e

N = 2000


def scenario(new):
    s = new("random_kills", psp_args=[
        "--seed", "5", "--latency-ms", "20", "--latency-jitter-ms", "30",
        "--fault", "drop_after=0.05", "--fault", "error_before=0.03"])
    rnd = random.Random(9)
    cmds = [e2e.new_command() for _ in range(N)]
    s.start_worker()
    s.start_worker()
    s.publish(cmds + rnd.sample(cmds, N // 10))
    kills = 0
    while kills < 5:
        time.sleep(rnd.uniform(1.0, 2.5))
        victim = rnd.choice(list(s.workers))
        s.kill_worker(victim)
        kills += 1
        s.start_worker()
        done = int(s.query("SELECT count(*) FROM payment_attempts WHERE status <> 'PENDING' "
                           "AND NOT (status = 'PROCESSING' AND lease_owner IS NOT NULL)")[0][0])
        e2e.log("kill", kills, "settled so far", done)
    s.wait_settled(N, timeout=600)
    s.check_invariants()


if __name__ == "__main__":
    raise SystemExit(e2e.main(scenario))
