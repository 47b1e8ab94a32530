#!/usr/bin/env python3
"""Adversary 38f, break: with more members asking than the limit has whole
requests/s, the same members get nothing for as long as the others have a
backlog: a charge waits behind charges of its own priority that came after
it, on other workers, without bound.

Every target is a whole number of requests/s; the units are handed out to
the largest fractions, ties to the first member in member_id order
(budget_alloc.c quantize), and every member computes the same order
(the fix of adversary 38b). Three workers that each have a backlog ask
the same (max-min fair: 2/3 of a request each), so the fractions tie every
time and the two first ids get 1 req/s each, the third 0, at every refresh,
for as long as the two others have charges waiting. Nothing rotates the odd
unit. Issue 38: a class waits only for classes above it; here the third
worker's charges wait for the same class, and its partitions stall
(with a steady inflow, for good).

Three workers, six partitions, a budget (and psp-sim) of 2 req/s, 90
charges queued: over 15 s the provider answers ~30 requests; every worker
must have had at least one of them (a fair share is ~10 each)."""
import time

import charged_e2e as e2e
from charged_e2e import check

LIMIT = 2
WATCH_S = 15


def scenario(new):
    s = new("adv38f_odd_unit", partitions=6, psp_args=["--rate-limit", str(LIMIT)])
    p = s.run([e2e.CHARGECTL, "provider", "limits", "set", "--actor", "adv38f",
               "--global", str(LIMIT)])
    check(p.returncode == 0, "chargectl provider limits set")
    ws = [s.start_worker() for _ in range(3)]
    s.wait_group_settled(ws)
    s.publish([e2e.new_command(amount=100 + i) for i in range(90)])
    # Every worker has charges waiting for the budget (demand in its row).
    e2e.wait_until("three workers with demand", lambda: s.query(
        "SELECT count(*) FROM provider_budget_members WHERE role = 'worker'"
        " AND expires_at > now() AND demand_mrps::text <> "
        "array_fill(0::bigint, ARRAY[30])::text")[0][0] == "3", e2e.scaled(20), 0.1)
    before = {w: len(s.worker_log(w, "provider answered")) for w in ws}
    t0 = time.time()
    holds = []
    while time.time() < t0 + WATCH_S:
        holds.append(s.query("SELECT pid, held_mrps[1] FROM provider_budget_members"
                             " WHERE role = 'worker' AND expires_at > now()"
                             " ORDER BY member_id"))
        time.sleep(0.5)
    sent = {w: len(s.worker_log(w, "provider answered")) - before[w] for w in ws}
    pids = {w: s.process(w).pid for w in ws}
    held = {}
    for snap in holds:
        for pid, h in snap:
            held.setdefault(int(pid), []).append(int(h) // 1000)
    e2e.log("requests answered per worker in %d s:" % WATCH_S, sent)
    e2e.log("held req/s per worker (member_id order), every 0.5 s:",
            {w: held.get(pids[w]) for w in ws})
    starved = [w for w in ws if sent[w] == 0]
    check(not starved,
          "with a limit of %d req/s and three workers with backlogs, %s sent nothing in "
          "%d s (held 0 at every refresh) while the others sent %s: the odd units go "
          "to the first member ids every time"
          % (LIMIT, starved, WATCH_S, {w: sent[w] for w in ws if w not in starved}))


if __name__ == "__main__":
    raise SystemExit(e2e.main(scenario))
