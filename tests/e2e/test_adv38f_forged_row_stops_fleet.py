#!/usr/bin/env python3
"""Adversary 38f, break: one row of provider_budget_members that no member
wrote stops the whole fleet for good, though docs/architecture.md ("A row
is not trusted") promises that such a row "cannot stop the fleet for longer
than a lease or refuse the allocation" (migration 0022 and
budget_share_bound / budget_demand_bound were the fix of adversary 38's
finding 6).

Rows that pass 0022's checks and still fail every member's refresh:

- expires_at 'infinity': read_others computes
  ceil(extract(epoch FROM expires_at - now()) * 1000)::bigint, and
  PostgreSQL refuses it ("cannot subtract infinite timestamps");
- held_mrps with a lower bound other than 1 ('[0:7]={0,...}'): cardinality 8,
  no NULL, every value in range, but its text starts with '[', and
  parse_array refuses the row ("a member's row is not as 0020 made it");
- 4,097 rows each as a member writes it, but for a lease of an hour:
  budget_alloc_member_target refuses more than BUDGET_MEMBERS_MAX (4,096)
  members ("allocation refused: too many members").

The refresh fails before write_member, so the statement that bounds every
other lease to 2 s from now and deletes the ended ones never runs: the row
lives as long as it says (forever), every refresh of every member fails,
each gate closes when its lease ends, and no request is sent again.

One worker, a budget of 50 req/s, no limit at psp-sim: 20 charges settle;
the row is written; once the worker's own lease has ended (its row's
expires_at passed), 20 more are published and must settle within 15 s
(the promise: at most a lease, 2 s)."""
import time

import charged_e2e as e2e
from charged_e2e import check

LIMIT = 50
AFTER_S = 15

# (held_mrps, expires_at, how many rows)
ROWS = {
    "expires_at infinity":
        ("array_fill(0::bigint, ARRAY[8])", "'infinity'::timestamptz", 1),
    "held_mrps with lower bound 0":
        ("'[0:7]={0,0,0,0,0,0,0,0}'::bigint[]", "now() + interval '1 hour'", 1),
    # Each row as a member writes it but for its hour-long lease (which a
    # refresh would bound to 2 s), one more than BUDGET_MEMBERS_MAX (4096).
    "4097 well-formed rows":
        ("array_fill(0::bigint, ARRAY[8])", "now() + interval '1 hour'", 4097),
}


def one(new, what):
    held, expires, rows = ROWS[what]
    s = new("adv38f_forged", partitions=4)
    p = s.run([e2e.CHARGECTL, "provider", "limits", "set", "--actor", "adv38f",
               "--global", str(LIMIT)])
    check(p.returncode == 0, "chargectl provider limits set")
    w = s.start_worker()
    s.wait_group_settled([w])
    s.publish([e2e.new_command(amount=100 + i) for i in range(20)])
    s.wait_settled(20, e2e.scaled(30))
    # Accepted by every CHECK of 0020 and 0022.
    s.query("INSERT INTO provider_budget_members (account, member_id, role, pid, host,"
            " demand_mrps, held_mrps, settings_version, expires_at) SELECT 'default',"
            " gen_random_uuid(), 'forged', 1, 'nowhere', array_fill(0::bigint, ARRAY[30]),"
            " %s, 1, %s FROM generate_series(1, %d)" % (held, expires, rows))
    written = s.query("SELECT clock_timestamp()")[0][0]  # after the rows' commit
    # The worker's own lease ends (its refreshes fail from the row on, and
    # its last good one is at most BUDGET_LEASE_MS old), or it refreshed
    # with the rows in sight (a refresh whose transaction began after they
    # were committed: its share is one granted with them there): a
    # condition, not a sleep. Only then the new charges: none can ride on a
    # share from before the rows. (The wait was for the lease's end alone,
    # which a refresh that tolerates the rows never gives.)
    e2e.wait_until("the worker's lease ended or it refreshed past the rows",
                   lambda: s.query(
        "SELECT count(*) = 0 OR bool_or(refreshed_at > %s::timestamptz)"
        " FROM provider_budget_members WHERE role = 'worker'"
        " AND expires_at > now()" % ("'%s'" % written))[0][0] == "t", e2e.scaled(10), 0.05)
    s.publish([e2e.new_command(amount=200 + i) for i in range(20)])
    t0 = time.time()
    done, at5 = 0, None
    while time.time() < t0 + AFTER_S and done < 40:
        done = int(s.query("SELECT count(*) FROM payment_attempts"
                           " WHERE status = 'SUCCEEDED'")[0][0])
        if at5 is None and time.time() >= t0 + 5:
            at5 = done
        time.sleep(0.2)
    fails = s.worker_log(w, "provider budget: refresh failed")
    e2e.log(what, ": succeeded", done, "of 40; psp-sim charges", len(s.ledger()),
            "; refresh failures logged:", [l.get("error") for l in fails][:1])
    s.close()  # its worker off the CPU before the next one starts
    return done, at5, fails


def scenario(new):
    broken = []
    for what in ROWS:
        done, at5, fails = one(new, what)
        if done < 40:
            broken.append("%s: %d of the 20 charges published after it succeeded in %d s,"
                          " none of them after +5 s: %s (worker: %s)"
                          % (what, done - 20, AFTER_S, at5 == done,
                             fails[0].get("error") if fails else "-"))
    check(not broken,
          "forged rows of provider_budget_members (which 0022 accepts) stop the "
          "fleet for good, not for at most a lease: " + "; ".join(broken))


if __name__ == "__main__":
    raise SystemExit(e2e.main(scenario))
