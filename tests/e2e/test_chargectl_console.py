#!/usr/bin/env python3
"""chargectl console token add/list/revoke against the stack's PostgreSQL.

Covered: add prints a secret of the documented shape once (text and
--json) and the database holds only its SHA-256, nowhere the secret; a
name taken by a live token is refused (exit 1, one line) and logged; list
shows every token newest first, with no secret or hash; revoke ends the
token's sessions in the same statement, a second revoke is refused, and
the name may then be given to a new token; every add and revoke is in
console_actions with its actor (the OS user unless --actor)."""
import hashlib
import json
import os
import pwd
import re

import charged_e2e as e2e
from charged_e2e import check, check_eq

CTL = e2e.CHARGECTL
SECRET = re.compile(r"cct_[A-Za-z0-9_-]{43}")


def ctl(s, *args):
    return s.run([CTL, "console", "token"] + list(args), check=False)


def ok(s, *args):
    p = ctl(s, *args)
    check(p.returncode == 0, "console token %s: exit %d, want 0; stderr %r" % (
        " ".join(args), p.returncode, p.stderr.decode()))
    return p.stdout.decode()


def refused(s, *args, mention=()):
    p = ctl(s, *args)
    err = p.stderr.decode().strip()
    check(p.returncode == 1, "console token %s: exit %d, want 1; stderr %r" % (
        " ".join(args), p.returncode, err))
    check(err and "\n" not in err, "want one line on stderr, got %r" % err)
    for m in mention:
        check(m in err, "stderr %r does not mention %r" % (err, m))
    check(not SECRET.search(p.stdout.decode()), "a refused add printed a secret")


def sha256(s):
    return hashlib.sha256(s.encode()).hexdigest()


def nowhere_in_tables(s, secret):
    for table in ("console_tokens", "console_sessions", "console_actions"):
        n = s.query("SELECT count(*) FROM %s x WHERE strpos(x::text, '%s') > 0"
                    % (table, secret[4:]))[0][0]
        check_eq(n, "0", "rows of %s holding the secret" % table)


def scenario(new):
    s = new("chargectl_console", partitions=1)
    me = pwd.getpwuid(os.geteuid()).pw_name

    # --json: the secret in its member, and only there.
    made = json.loads(ok(s, "add", "alice", "--role", "operator", "--json"))
    check_eq(sorted(made), ["created_by", "name", "role", "secret"], "members of add --json")
    check_eq((made["name"], made["role"], made["created_by"]), ("alice", "operator", me),
             "add --json")
    secret = made["secret"]
    check(SECRET.fullmatch(secret), "secret %r is not cct_ and 43 base64url characters" % secret)

    # Text: the secret on a line of its own, and the warning that it is
    # shown only now.
    out = ok(s, "add", "bob", "--role", "viewer", "--actor", "ops")
    found = SECRET.findall(out)
    check_eq(len(found), 1, "secrets in add's text output")
    check("shown only now" in out, "add's text does not say the secret is shown only now: %r"
          % out)
    bob = found[0]
    check(bob != secret, "two tokens share a secret")

    rows = s.query("SELECT name, role, created_by, token_sha256 FROM console_tokens ORDER BY id")
    check_eq(rows, [["alice", "operator", me, sha256(secret)],
                    ["bob", "viewer", "ops", sha256(bob)]], "console_tokens")
    nowhere_in_tables(s, secret)
    nowhere_in_tables(s, bob)

    refused(s, "add", "alice", "--role", "viewer", mention=("alice",))
    check_eq(s.query("SELECT count(*) FROM console_tokens")[0][0], "2", "tokens after a refusal")

    listed = json.loads(ok(s, "list", "--json"))
    check_eq([t["name"] for t in listed], ["bob", "alice"], "list --json, newest first")
    check_eq(sorted(listed[0]), ["created_at", "created_by", "last_used_at", "name",
                                 "revoked_at", "role"], "members of a listed token")
    check(listed[1]["revoked_at"] is None, "alice is listed revoked before her revocation")
    text = ok(s, "list")
    check(text.split("\n")[0].split()[:2] == ["NAME", "ROLE"], "list's header: %r" % text)
    for t in (text, json.dumps(listed)):
        check(secret[4:] not in t and sha256(secret) not in t, "list shows a secret or a hash")

    # A session of alice's, as the console makes one: revoke ends it.
    s.psql(s.db, "INSERT INTO console_sessions (session_sha256, token_id, csrf_token, expires_at)"
                 " SELECT '%s', id, 'csrf', now() + interval '1 h' FROM console_tokens"
                 " WHERE name = 'alice'" % sha256("ccs_e2e"))
    s.psql(s.db, "INSERT INTO console_sessions (session_sha256, token_id, csrf_token, expires_at)"
                 " SELECT '%s', id, 'csrf', now() + interval '1 h' FROM console_tokens"
                 " WHERE name = 'bob'" % sha256("ccs_bob"))
    gone = json.loads(ok(s, "revoke", "alice", "--actor", "ops", "--json"))
    check_eq(gone, {"name": "alice", "revoked": True, "revoked_by": "ops"}, "revoke --json")
    check_eq(s.query("SELECT t.name FROM console_sessions s JOIN console_tokens t"
                     " ON t.id = s.token_id"), [["bob"]], "sessions after alice's revocation")
    refused(s, "revoke", "alice", mention=("alice",))
    refused(s, "revoke", "nobody", mention=("nobody",))

    # The name is free again; the old token stays, revoked, for the record.
    again = json.loads(ok(s, "add", "alice", "--role", "viewer", "--json"))
    check(again["secret"] != secret, "a new token reuses the old secret")
    listed = json.loads(ok(s, "list", "--json"))
    check_eq([(t["name"], t["role"], t["revoked_at"] is None) for t in listed],
             [("alice", "viewer", True), ("bob", "viewer", True), ("alice", "operator", False)],
             "list after the name's reuse")
    check(re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z", listed[2]["revoked_at"]),
          "revoked_at %r is not RFC 3339 UTC" % listed[2]["revoked_at"])
    out = ok(s, "revoke", "bob")
    check("bob" in out and "revoked" in out, "revoke's text: %r" % out)

    actions = s.query("SELECT actor, action, target, outcome FROM console_actions ORDER BY id")
    check_eq(actions, [
        [me, "token_add", "alice", "ok"],
        ["ops", "token_add", "bob", "ok"],
        [me, "token_add", "alice", "refused"],
        ["ops", "token_revoke", "alice", "ok"],
        [me, "token_revoke", "alice", "not_found"],
        [me, "token_revoke", "nobody", "not_found"],
        [me, "token_add", "alice", "ok"],
        [me, "token_revoke", "bob", "ok"],
    ], "console_actions")
    check_eq(s.query("SELECT detail->>'sessions_ended' FROM console_actions"
                     " WHERE action = 'token_revoke' AND outcome = 'ok' ORDER BY id"),
             [["1"], ["1"]], "sessions each revocation ended")
    for t in (secret, bob, again["secret"]):
        nowhere_in_tables(s, t)


if __name__ == "__main__":
    import sys
    sys.exit(e2e.main(scenario))
