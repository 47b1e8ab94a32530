#!/usr/bin/env python3
"""The simulation's tests (tests/sim): test_sim.py MODE CHARGED_SIM.

short   1,000,000 steps over each of three seeds: no invariant broken, and
        the faults it is there for (lost answers, takeovers, clock jumps,
        crashes, rebalances, the reconciler's settlements) did happen, and
        the authorizations' steps (captures, voids, a hold lost to a racer,
        a step in doubt, refunds of a capture).
rules   each --break RULE is caught, by the invariant that rule keeps, within
        1,000,000 steps (RULE_BOUNDS: more for a few), for every seed of a fixed list; the exit is 1 and
        the report names the rule. The same seeds without --break break none.
budget  --budget 4 (each worker's share of the provider budget, requests/s):
        over three seeds no invariant broken and calls parked for the budget;
        with --break budget (calls sent without asking the gate) the
        invariant budget-per-second (never more calls started in a second
        than the share) is caught.
replay  the same seed and steps print the same final hash (a violation too:
        the same step), alone or after another seed in one process; another
        seed prints another.
"""
import re
import subprocess
import sys

SEEDS = [1, 2, 3]
BOUND = 1_000_000
# The rule dropped -> the invariant that must catch it.
RULES = {
    "epoch-fence": "status-transition",
    "key-window": "key-after-retention",
    "one-live-per-order": "one-charge-per-order",
    "commit-after-durable": "commit-after-durable",
    "refund-reservation": "refund-within-charge",
    # A request may reach the provider as late as the caller's timeout: a
    # window with no margin sends what lands after the key is forgotten.
    "key-margin": "key-after-retention",
    # A look-up by metadata may lag past any promise: only the consistent
    # list may say that nothing executed.
    "list-skipped": "failed-with-charge",
    # An intent another client made, its metadata naming a live attempt
    # (issue 34): only the attempt's own intent may move it.
    "ownership": "settled-by-foreign",
    # Migration 0016's rules of an authorization (issue 37), one each,
    # caught from the provider's ledger: a capture that takes a captured
    # (or capture-held) authorization asks for a second capture; one that
    # takes a voided (or void-held) one captures after a void; one past the
    # authorization's amount captures more than it holds; refunds bound by
    # the authorized amount refund more than the capture took.
    "capture-hold": "one-capture-per-authorization",
    "void-hold": "capture-after-void",
    "capture-amount": "captured-within-authorized",
    "refund-captured": "refund-within-captured",
    # Issue 38 (adversary 36): throttled (429) or key-in-use (409) jobs park
    # out of the in-flight slots; retried in their slots, they hold them all
    # while commands wait in the backlog (a storm of 429s does it). And a
    # parked job still settles: one that never comes back is caught.
    "park": "throttled-holds-slots",
    "unpark": "parked-comes-back",
}

# Rules whose break needs rarer luck. key-margin: a key first sent a
# retention ago and sent again in the last PROVIDER_TIMEOUT_MS of it
# (seeds 1-20: 17 within 3,000,000 steps); list-skipped: a look past the
# key's window at an intent the look-up by metadata never shows (20 within
# 3,000,000, median about 300,000).
# epoch-fence: a settlement while a worker's call is in flight comes only
# from the reconciler's takeover of an expired lease since webhooks that
# only name an attempt no longer settle it (issue 34): seeds 1-3 within
# 1,250,000 steps.
RULE_BOUNDS = {"key-margin": 5_000_000, "list-skipped": 3_000_000,
               "epoch-fence": 3_000_000}


def run(sim, *args):
    p = subprocess.run([sim, *map(str, args)], capture_output=True, text=True,
                       timeout=240)
    return p.returncode, p.stdout, p.stderr


def seed_lines(out):
    return [dict(zip(l.split()[0::2], l.split()[1::2]))
            for l in out.splitlines() if l.startswith("seed ")]


def fail(msg):
    print("FAIL: " + msg)
    sys.exit(1)


def short(sim):
    rc, out, err = run(sim, "--seed", 1, "--steps", BOUND, "--seeds", len(SEEDS))
    if rc != 0:
        fail(f"exit {rc} without --break:\n{err}")
    lines = seed_lines(out)
    if [int(l["seed"]) for l in lines] != SEEDS:
        fail(f"expected one line per seed {SEEDS}, got:\n{out}")
    for l in lines:
        for what in ("lost", "takeovers", "key_closed", "rec_settled",
                     "rec_charges", "never_executed", "applied", "foreign", "jumps",
                     "crashes", "rebalances",
                     # issue 37: holds, captures, voids, the hold lost by a
                     # racer, a step in doubt, refunds of a capture
                     "authorized", "captured", "voided", "hold_lost",
                     "step_unknown", "captured_refunds",
                     # issue 38: 429s (storms of them) parked their jobs
                     "throttled", "parked"):
            if int(l[what]) == 0:
                fail(f"seed {l['seed']}: no {what} in {BOUND} steps: the run "
                     f"did not exercise what it is for")
    # A worker fenced out by a settlement made while its call was in
    # flight. Only the reconciler's takeover of an expired lease does that
    # now (a webhook about an intent that only names the attempt no longer
    # settles it, issue 34): rarer, so counted over the seeds together.
    if sum(int(l["fenced"]) for l in lines) == 0:
        fail(f"no fenced in {len(lines)} seeds x {BOUND} steps: the run did not "
             f"exercise what it is for")
    print(f"short: {len(lines)} seeds x {BOUND} steps, no violation; {err.strip()}")


def rules(sim):
    for rule, invariant in RULES.items():
        for seed in SEEDS:
            bound = RULE_BOUNDS.get(rule, BOUND)
            rc, out, err = run(sim, "--seed", seed, "--steps", bound, "--break", rule)
            m = re.search(r"VIOLATION rule=(\S+) seed=(\d+) step=(\d+)", err)
            if rc != 1 or not m:
                fail(f"--break {rule} seed {seed}: exit {rc}, no violation "
                     f"reported:\n{err[-2000:]}")
            if m.group(1) != invariant:
                fail(f"--break {rule} seed {seed}: caught as {m.group(1)}, "
                     f"expected {invariant}:\n{err[-2000:]}")
            if int(m.group(2)) != seed or int(m.group(3)) >= bound:
                fail(f"--break {rule}: report names seed {m.group(2)} step "
                     f"{m.group(3)}")
            if f"break={rule}" not in err or "last steps:" not in err:
                fail(f"--break {rule}: the report lacks the rule or the trace")
            print(f"rules: --break {rule} seed {seed}: {invariant} at step "
                  f"{m.group(3)}")
    rc, out, err = run(sim, "--seed", SEEDS[0], "--steps", 200_000, "--seeds",
                       len(SEEDS))
    if rc != 0:
        fail(f"without --break: exit {rc}:\n{err}")
    print("rules: without --break no violation")


def budget(sim):
    rc, out, err = run(sim, "--seed", 1, "--steps", 300_000, "--seeds", len(SEEDS),
                       "--budget", 4)
    if rc != 0:
        fail(f"--budget 4: exit {rc}:\n{err}")
    for l in seed_lines(out):
        for what in ("budget_parked", "persisted", "parked"):
            if int(l[what]) == 0:
                fail(f"--budget 4 seed {l['seed']}: no {what}")
    for seed in SEEDS:
        rc, out, err = run(sim, "--seed", seed, "--steps", 300_000, "--budget", 4,
                           "--break", "budget")
        m = re.search(r"VIOLATION rule=(\S+)", err)
        if rc != 1 or not m or m.group(1) != "budget-per-second":
            fail(f"--budget 4 --break budget seed {seed}: exit {rc}, "
                 f"not caught as budget-per-second:\n{err[-2000:]}")
    print("budget: no violation with a share of 4/s; without the gate "
          "budget-per-second is caught")


def replay(sim):
    a = run(sim, "--seed", 5, "--steps", 300_000)
    b = run(sim, "--seed", 5, "--steps", 300_000)
    c = run(sim, "--seed", 6, "--steps", 300_000)
    if a[0] != 0 or b[0] != 0 or c[0] != 0:
        fail("a replay run broke an invariant")
    ha, hb, hc = (seed_lines(x[1])[0]["hash"] for x in (a, b, c))
    if ha != hb:
        fail(f"seed 5 twice: hashes {ha} and {hb}")
    if ha == hc:
        fail(f"seeds 5 and 6: the same hash {ha}")
    d = run(sim, "--seed", 4, "--steps", 300_000, "--seeds", 2)
    if seed_lines(d[1])[1]["hash"] != ha:
        fail("seed 5 after seed 4 in one process: another hash than alone")
    v1 = run(sim, "--seed", 2, "--steps", BOUND, "--break", "key-window")
    v2 = run(sim, "--seed", 2, "--steps", BOUND, "--break", "key-window")
    if v1[0] != 1 or v1[1] != v2[1] or v1[2] != v2[2]:
        fail("a violation did not replay exactly from its seed")
    print(f"replay: seed 5 -> {ha} twice, seed 6 -> {hc}; a violation replays")


def main():
    modes = {"short": short, "rules": rules, "replay": replay, "budget": budget}
    if len(sys.argv) != 3 or sys.argv[1] not in modes:
        print(__doc__)
        return 2
    modes[sys.argv[1]](sys.argv[2])
    print("1 passed, 0 failed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
