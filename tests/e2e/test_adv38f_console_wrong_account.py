#!/usr/bin/env python3
"""Adversary 38f, break: the console's provider limits page reads and sets
the budget of the account "default" whatever the fleet's account is, so on
a fleet configured with PROVIDER_BUDGET_ACCOUNT (docs/configuration.md: "the
provider account whose budget the process draws from") an operator's change
on the page is recorded, answered 200 with the settings after, and followed
by nobody. Issue 38, "Set at run time": `chargectl provider limits show|set`
and the console's operator page change the budget; the fleet follows within
2 s.

console_limits.c opens its lease with BUDGET_ACCOUNT_DEFAULT, while the
console's own member (daemon_budget_join, for its resolves) and every other
role join PROVIDER_BUDGET_ACCOUNT.

A console and a worker with PROVIDER_BUDGET_ACCOUNT=live: the page must
show the account's live members (the console's own, the worker) and its
change must reach the account's row (global 7) and the worker's share
within 2 s."""
import time

import charged_console as con
import charged_e2e as e2e
from charged_e2e import check

ACCOUNT = "live"


def scenario(new):
    s = new("adv38f_console_acct", partitions=2,
            worker_env={"PROVIDER_BUDGET_ACCOUNT": ACCOUNT})
    w = s.start_worker()
    s.wait_group_settled([w])
    _, port = con.start_console(s, PROVIDER_BUDGET_ACCOUNT=ACCOUNT)
    op = con.Client(port, con.token(s, "olga", "operator"))
    e2e.wait_until("the worker and the console are members of '%s'" % ACCOUNT, lambda: s.query(
        "SELECT count(*) FROM provider_budget_members WHERE account = '%s'"
        " AND expires_at > now()" % ACCOUNT)[0][0] == "2", e2e.scaled(10), 0.1)
    st, shown = op.get("provider-limits")
    st2, after = op.post("provider-limits/set", {"global": 7})
    t0 = time.time()
    followed = None
    while time.time() < t0 + 2.5:
        rows = s.query("SELECT held_mrps[1] FROM provider_budget_members WHERE account ="
                       " '%s' AND role = 'worker' AND expires_at > now()" % ACCOUNT)
        if rows and 0 <= int(rows[0][0]) <= 7000:
            followed = time.time() - t0
            break
        time.sleep(0.1)
    rows = s.query("SELECT account, global_rps, version, updated_by FROM provider_budget"
                   " ORDER BY account")
    e2e.log("page showed account", shown.get("account"), "members",
            [m.get("role") for m in shown.get("members", [])], "; set answered", st2,
            after.get("account"), after.get("global_rps"), "; rows:", rows)
    check(shown.get("account") == ACCOUNT and after.get("account") == ACCOUNT
          and followed is not None,
          "with PROVIDER_BUDGET_ACCOUNT=%s for the console and the worker, the console's "
          "limits page showed account %r (members %s) and its change (global 7, answered "
          "%d) went to account %r: the settings rows are %s and the worker's share did not "
          "follow within 2.5 s"
          % (ACCOUNT, shown.get("account"), [m.get("role") for m in shown.get("members", [])],
             st2, after.get("account"), rows))


if __name__ == "__main__":
    raise SystemExit(e2e.main(scenario))
