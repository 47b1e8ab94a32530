#!/usr/bin/env python3
"""The console's provider limits (issue 38, "Set at run time"), over plain
HTTP against real PostgreSQL: GET provider-limits shows the settings and
the live members' shares as chargectl does; a viewer's change, and an
operator's without the CSRF token, are 403 and change nothing; an
operator's change bumps the version and is recorded with the console user
as its actor (provider_budget_changes and console_actions); a bad body is
400 and a refused value 422, both recorded, nothing changed."""

import json
import uuid

import charged_console as con
import charged_e2e as e2e
from charged_e2e import check, check_eq


def version(s):
    return int(s.query("SELECT version FROM provider_budget")[0][0])


def scenario(new):
    s = new("console_limits")
    _, port = con.start_console(s)
    op = con.Client(port, con.token(s, "olga", "operator"))
    viewer = con.Client(port, con.token(s, "vera", "viewer"))

    st, shown = viewer.get("provider-limits")
    # The console draws from the budget itself (its resolves call the
    # provider): it is the only member of a fresh budget.
    check_eq((st, shown["global_rps"], shown["classes"]["create"],
              [m["role"] for m in shown["members"]]),
             (200, 0, 0, ["console"]), "a fresh budget, as a viewer sees it")
    v0 = shown["version"]
    check_eq(viewer.post("provider-limits/set", {"global": 100})[0], 403, "a viewer's change")
    check_eq(op.post("provider-limits/set", {"global": 100}, csrf=False)[0], 403,
             "a change without the CSRF token")
    check_eq(version(s), v0, "the version after the refused changes")

    st, after = op.post("provider-limits/set", {"global": 100, "classes": {"create": 25},
                                                "audit_floor": 2})
    check_eq((st, after["global_rps"], after["classes"]["create"], after["classes"]["search"],
              after["audit_floor_rps"], after["updated_by"], after["version"]),
             (200, 100, 25, 0, 2, "olga", v0 + 1), "an operator's change")
    check_eq(s.query("SELECT actor, before->>'global_rps', after->>'global_rps'"
                     " FROM provider_budget_changes"), [["olga", "0", "100"]],
             "the change and its actor")
    for body in ({}, {"global": -1}, {"global": "100"}, {"classes": {"charges": 3}},
                 {"rate": 3}):
        st, doc = op.post("provider-limits/set", body)
        check(st == 400 and doc.get("error"), "body %s: %s %s, want 400" % (body, st, doc))
    st, doc = op.post("provider-limits/set", {"audit_floor": 101})
    check(st == 422 and "floor" in doc.get("error", ""), "a floor above the limit: %s %s"
          % (st, doc))
    check_eq(version(s), v0 + 1, "the version after the refusals")
    actions = s.query("SELECT actor, action, outcome FROM console_actions"
                      " WHERE action = 'provider_limits' ORDER BY id")
    check_eq([tuple(a) for a in actions],
             [("vera", "provider_limits", "forbidden"), ("olga", "provider_limits", "forbidden"),
              ("olga", "provider_limits", "ok"), ("olga", "provider_limits", "refused")],
             "the action log")

    # A live member, as a refresh writes it: the page shows its share, as
    # chargectl provider limits show does.
    s.psql(s.db, "INSERT INTO provider_budget_members (account, member_id, role, pid, host,"
                 " demand_mrps, held_mrps, settings_version, expires_at) VALUES ('default',"
                 " '%s', 'worker', 42, 'h1', array_fill(0::bigint, ARRAY[30]),"
                 " '{20000,12500,-1,-1,-1,10000,-1,1000}', 2, now() + interval '1 h')"
                 % uuid.uuid4())
    st, shown = op.get("provider-limits")
    ctl = json.loads(s.run([e2e.CHARGECTL, "provider", "limits", "show", "--json"]).stdout)
    # Beside the console's own membership.
    workers = [m for m in shown["members"] if m["role"] != "console"]
    check_eq([(m["role"], m["pid"], m["held_mrps"]) for m in workers],
             [("worker", 42, [20000, 12500, -1, -1, -1, 10000, -1, 1000])], "the members")
    check_eq([m["held_mrps"] for m in ctl["members"] if m["role"] == "worker"],
             [workers[0]["held_mrps"]], "the console and chargectl")


if __name__ == "__main__":
    raise SystemExit(e2e.main(scenario))
