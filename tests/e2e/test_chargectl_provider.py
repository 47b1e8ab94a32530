#!/usr/bin/env python3
"""chargectl provider limits show|set against the stack's PostgreSQL (a
database of its own; no Kafka, no psp-sim).

Covered: a fresh database has no limit (show, text and --json); set changes
only the settings given, bumps the version and records the change with its
actor (the OS user unless --actor) before and after; show lists the live
members with their shares (an expired one is not listed); bad usage and
refused values exit 2 with one line on stderr and change nothing; an
unknown account exits 1; --help documents it all."""
import json
import os
import pwd
import subprocess
import sys
import uuid

import charged_e2e as e2e
from charged_e2e import check, check_eq

CTL = e2e.CHARGECTL


def psql(url, sql):
    p = subprocess.run(["psql", "-X", "-q", "-tA", "-v", "ON_ERROR_STOP=1", url, "-c", sql],
                       capture_output=True)
    check(p.returncode == 0, "psql: %s" % p.stderr.decode())
    return p.stdout.decode().strip()


def ctl(db, *args, account=None):
    env = dict(os.environ, DATABASE_URL=db)
    env.pop("PROVIDER_BUDGET_ACCOUNT", None)
    if account:
        env["PROVIDER_BUDGET_ACCOUNT"] = account
    return subprocess.run([CTL, "provider", "limits"] + list(args), capture_output=True,
                          env=env, timeout=e2e.scaled(30))


def ok(db, *args, account=None):
    p = ctl(db, *args, account=account)
    check(p.returncode == 0, "limits %s: exit %d, want 0; stderr %r" % (
        " ".join(args), p.returncode, p.stderr.decode()))
    return p.stdout.decode()


def refused(db, code, *args, mention=()):
    p = ctl(db, *args)
    err = p.stderr.decode().strip()
    check(p.returncode == code, "limits %s: exit %d, want %d; stderr %r" % (
        " ".join(args), p.returncode, code, err))
    check(err and "\n" not in err, "want one line on stderr, got %r" % err)
    for m in mention:
        check(m in err, "stderr %r does not mention %r" % (err, m))


def scenario(db):
    me = pwd.getpwuid(os.geteuid()).pw_name
    helped = ok(db, "--help")
    for word in ("show", "set", "--global", "--class CLASS=N", "--audit-floor", "--actor",
                 "PROVIDER_BUDGET_ACCOUNT",
                 "create, capture, refund, retrieve, search, list", "Exit status"):
        check(word in helped, "the help does not mention %r" % word)
    shown = json.loads(ok(db, "show", "--json"))
    check_eq((shown["global_rps"], shown["classes"]["search"], shown["version"],
              shown["members"]), (0, 0, 1, []), "a fresh database's budget")
    text = ok(db, "show")
    check("global        no limit" in text, "show's text: %r" % text)

    after = json.loads(ok(db, "set", "--global", "100", "--class", "create=25",
                          "--class", "search=20", "--audit-floor", "2", "--json"))
    check_eq((after["global_rps"], after["classes"]["create"], after["classes"]["search"],
              after["classes"]["refund"], after["audit_floor_rps"], after["version"],
              after["updated_by"]), (100, 25, 20, 0, 2, 2, me), "set --json")
    out = ok(db, "set", "--global", "40", "--actor", "ops")
    check("global        40/s" in out and "create        25/s" in out,
          "set keeps what it is not given: %r" % out)
    check_eq(psql(db, "SELECT string_agg(actor || ':' || (before->>'global_rps') || '>'"
                      " || (after->>'global_rps'), ',' ORDER BY id)"
                      " FROM provider_budget_changes"),
             "%s:0>100,ops:100>40" % me, "the changes and their actors")

    # Members as a refresh writes them: a live one with a share, and one
    # whose lease ended (not shown).
    for expires in ("now() + interval '1 h'", "now() - interval '1 s'"):
        psql(db, "INSERT INTO provider_budget_members (account, member_id, role, pid,"
                 " host, demand_mrps, held_mrps, settings_version, expires_at)"
                 " VALUES ('default', '%s', 'worker', 42, 'h1', array_fill(0::bigint,"
                 " ARRAY[30]), '{20000,12500,-1,-1,-1,10000,-1,1000}', 3, %s)"
                 % (uuid.uuid4(), expires))
    shown = json.loads(ok(db, "show", "--json"))
    check_eq([(m["role"], m["pid"], m["held_mrps"][0]) for m in shown["members"]],
             [("worker", 42, 20000)], "the live members")
    text = ok(db, "show")
    check("members: 1" in text and "20.000" in text and "12.500" in text,
          "show's members: %r" % text)

    version = psql(db, "SELECT version FROM provider_budget")
    refused(db, 2, "set", "--audit-floor", "41", mention=("floor",))
    refused(db, 2, "set", "--global", "-1", mention=("--global",))
    refused(db, 2, "set", "--global", "1000001", mention=("--global",))
    refused(db, 2, "set", "--class", "charges=3", mention=("charges",))
    refused(db, 2, "set", "--class", "create", mention=("CLASS=N",))
    refused(db, 2, "set", mention=("--global",))
    refused(db, 2, "show", "--global", "3")
    refused(db, 2, "set", "--global")
    refused(db, 2, "set", "--bogus", mention=("--bogus",))
    refused(db, 2, "frob", mention=("frob",))
    check_eq(psql(db, "SELECT version FROM provider_budget"), version,
             "the version after refusals")
    refused(db, 1, "show", "--account", "nope", mention=("nope",))

    # The fleet's account (PROVIDER_BUDGET_ACCOUNT) unless --account: the
    # default "default" set a budget nobody followed on a fleet configured
    # otherwise (adversary 38f).
    psql(db, "INSERT INTO provider_budget (account, updated_by) VALUES ('live', 'test')")
    after = json.loads(ok(db, "set", "--global", "7", "--json", account="live"))
    check_eq((after["account"], after["global_rps"]), ("live", 7),
             "set with PROVIDER_BUDGET_ACCOUNT=live")
    check_eq(json.loads(ok(db, "show", "--json", account="live"))["account"], "live",
             "show with PROVIDER_BUDGET_ACCOUNT=live")
    check_eq(json.loads(ok(db, "show", "--json", "--account", "default",
                           account="live"))["global_rps"], 40, "--account over it")
    check_eq(psql(db, "SELECT string_agg(account || '=' || global_rps, ',' ORDER BY"
                      " account) FROM provider_budget"), "default=40,live=7",
             "the accounts' limits")


def main():
    admin = os.environ["CHARGED_TEST_DATABASE_URL"]
    name = "ctl_provider_%d_%s" % (os.getpid(), uuid.uuid4().hex[:6])
    db = admin.rsplit("/", 1)[0] + "/" + name
    psql(admin, 'CREATE DATABASE "%s"' % name)
    try:
        subprocess.run([CTL, "migrate"], env=dict(os.environ, DATABASE_URL=db), check=True,
                       capture_output=True, timeout=e2e.scaled(60))
        scenario(db)
        print("1 passed, 0 failed")
        return 0
    except Exception:
        import traceback
        traceback.print_exc()
        print("0 passed, 1 failed")
        return 1
    finally:
        psql(admin, 'DROP DATABASE IF EXISTS "%s"' % name)


if __name__ == "__main__":
    sys.exit(main())
