#!/usr/bin/env python3
"""Every program prints usage on --help (exit 0), and says why in one line on
stderr with exit 2 on bad usage or configuration. psp-sim's --help documents
every flag, fault kind and admin endpoint; the auditor's settings in its
--help are the ones docs/configuration.md documents. Needs no servers."""
import os
import re
import signal
import socket
import subprocess
import sys
import tempfile

import charged_e2e as e2e
from charged_e2e import check


def run(argv, env=None):
    e = {k: v for k, v in os.environ.items()
         if not k.startswith(("KAFKA_", "PROVIDER_", "WORKER_", "DATABASE_URL", "LOG_LEVEL"))}
    # The admin listener binds before a role checks its settings: a port
    # the kernel picks, so that no other process on the machine matters.
    e["ADMIN_ADDR"] = "127.0.0.1:0"
    e.update(env or {})
    return subprocess.run(argv, capture_output=True, env=e, timeout=e2e.scaled(30))


def expect_help(argv, must=()):
    p = run(argv)
    out = p.stdout.decode()
    check(p.returncode == 0 and "usage" in out,
          "%s: exit %d, want 0 with a usage text; stdout %r" % (argv, p.returncode, out[:200]))
    for word in must:
        check(word in out, "%s: the help does not mention %r" % (argv, word))


def expect_usage_error(argv, env=None, mention=None):
    p = run(argv, env)
    err = p.stderr.decode().strip()
    check(p.returncode == 2, "%s (env %s): exit %d, want 2; stderr %r" % (
        argv, env, p.returncode, err))
    check(err and "\n" not in err, "%s: want one line on stderr, got %r" % (argv, err))
    if mention:
        check(mention in err, "%s: stderr %r does not mention %r" % (argv, err, mention))


def scenario(_new):
    expect_help([e2e.CHARGED, "--help"], ["worker", "reconciler", "relay", "api", "auditor"])
    expect_help([e2e.CHARGED, "worker", "--help"],
                ["KAFKA_BOOTSTRAP_SERVERS", "PROVIDER_API_KEY", "WORKER_MAX_IN_FLIGHT",
                 "WORKER_LEASE_MS", "SHUTDOWN_TIMEOUT_MS"])
    expect_help([e2e.CHARGED, "api", "--help"],
                ["API_ADDR", "WEBHOOK_SIGNING_SECRET", "API_THREADS", "API_MAX_BODY_BYTES",
                 "/v1/webhooks/provider", "/v1/payment-attempts/"])
    expect_help([e2e.CHARGED, "auditor", "--help"],
                ["DATABASE_URL", "PROVIDER_API_KEY", "PROVIDER_BASE_URL", "AUDITOR_WINDOW_MS",
                 "AUDITOR_LAG_MS", "AUDITOR_POLL_MS", "AUDITOR_FROM", "AUDITOR_PENDING_BATCH",
                 "SHUTDOWN_TIMEOUT_MS", "chargectl audit list"] + list(AUDIT_KINDS))
    expect_help([e2e.CHARGECTL, "--help"], ["migrate", "publish", "dlq", "attempt", "refund",
                                           "audit", "console"])
    for argv in (["console", "--help"], ["console", "token", "--help"],
                 ["console", "token", "add", "--help"], ["console", "token", "list", "--help"]):
        expect_help([e2e.CHARGECTL] + argv,
                    ["token add NAME", "token list", "token revoke NAME", "--role", "viewer",
                     "operator", "--actor", "--json", "shown only", "Exit status"])
    expect_help([e2e.CHARGECTL, "audit", "--help"],
                ["audit list", "audit show WINDOW", "audit run", "--since", "--until",
                 "--findings", "--limit", "--json", "Exit status"] + list(AUDIT_KINDS))
    expect_help([e2e.CHARGECTL, "migrate", "--help"], ["--dir"])
    expect_help([e2e.CHARGECTL, "publish", "--help"],
                ["--attempt-id", "--order-id", "--idempotency-key", "--amount", "--currency",
                 "--payment-method", "--customer-id", "--metadata", "--file", "--json"])
    expect_help([e2e.PSP_SIM, "--help"],
                ["--host", "--port", "--admin-port", "--api-key", "--key-retention-ms",
                 "--threads", "--max-connections", "--seed", "--latency-ms",
                 "--latency-jitter-ms", "--stall-ms", "--fault", "error_before", "rate_limit",
                 "error_after", "stall_after", "drop_after", "/health", "/ledger", "/reset",
                 "/faults", "/retention", "--rate-limit", "--rate-limit-class",
                 "--rate-limit-retry-after", "/rate-limits", "throttled"])

    expect_usage_error([e2e.CHARGED], mention="missing role")
    expect_usage_error([e2e.CHARGECTL, "dlq"], mention="missing subcommand")
    expect_usage_error([e2e.CHARGECTL, "attempt", "list", "--bogus"], mention="--bogus")
    expect_usage_error([e2e.CHARGED, "nonsense"], mention="unknown role")
    expect_usage_error([e2e.CHARGECTL, "nonsense"], mention="unknown command")
    expect_usage_error([e2e.CHARGECTL, "migrate", "--bogus"])
    expect_usage_error([e2e.PSP_SIM, "--port", "70000"], mention="--port")
    expect_usage_error([e2e.PSP_SIM, "--fault", "explode=1"], mention="--fault")
    expect_usage_error([e2e.PSP_SIM, "--rate-limit-class", "charge=5"],
                       mention="--rate-limit-class")
    expect_usage_error([e2e.CHARGED, "worker"], mention="PROVIDER_API_KEY")
    expect_usage_error([e2e.CHARGED, "api"], mention="WEBHOOK_SIGNING_SECRET")
    expect_usage_error([e2e.CHARGED, "auditor"], mention="PROVIDER_API_KEY")
    # The provider's creation times are whole seconds.
    expect_usage_error([e2e.CHARGED, "auditor"],
                       env={"PROVIDER_API_KEY": "k", "AUDITOR_WINDOW_MS": "1500"},
                       mention="AUDITOR_WINDOW_MS")
    expect_usage_error([e2e.CHARGED, "auditor"],
                       env={"PROVIDER_API_KEY": "k", "AUDITOR_LAG_MS": "-1"},
                       mention="AUDITOR_LAG_MS")
    expect_usage_error([e2e.CHARGECTL, "audit"], mention="missing subcommand")
    expect_usage_error([e2e.CHARGECTL, "audit", "nonsense"], mention="unknown subcommand")
    expect_usage_error([e2e.CHARGED, "api"], env={"WEBHOOK_SIGNING_SECRET": "whsec_long_enough,short"},
                       mention="WEBHOOK_SIGNING_SECRET")
    expect_usage_error([e2e.CHARGED, "api"], env={"WEBHOOK_SIGNING_SECRET": " , "},
                       mention="WEBHOOK_SIGNING_SECRET")
    expect_usage_error([e2e.CHARGED, "api"],
                       env={"WEBHOOK_SIGNING_SECRET": "whsec_long_enough",
                            "API_ADDR": "no-such-host.invalid:8080", "ADMIN_ADDR": "127.0.0.1:0"},
                       mention="API_ADDR")
    expect_usage_error([e2e.CHARGED, "worker"],
                       env={"PROVIDER_API_KEY": "k", "LOG_LEVEL": "verbose"}, mention="LOG_LEVEL")
    expect_usage_error([e2e.CHARGED, "worker"],
                       env={"PROVIDER_API_KEY": "k", "PROVIDER_BREAKER_FAILURES": "1",
                            "ADMIN_ADDR": "127.0.0.1:0"},
                       mention="PROVIDER_BREAKER_FAILURES")
    expect_usage_error([e2e.CHARGED, "worker"],
                       env={"PROVIDER_API_KEY": "k", "PROVIDER_BREAKER_MIN_CALLS": "1",
                            "ADMIN_ADDR": "127.0.0.1:0"},
                       mention="PROVIDER_BREAKER_MIN_CALLS")
    expect_usage_error([e2e.CHARGED, "worker"],
                       env={"PROVIDER_API_KEY": "k", "WORKER_LEASE_MS": "5000",
                            "PROVIDER_TIMEOUT_MS": "10000"}, mention="WORKER_LEASE_MS")
    expect_usage_error([e2e.CHARGECTL, "publish", "--amount", "0", "--currency", "EUR",
                        "--payment-method", "pm_card_visa"], mention="amount")
    # A reconciler's provider call blocks its loop: a stall limit shorter
    # than one call would call a slow provider a stuck reconciler.
    expect_usage_error([e2e.CHARGED, "reconciler"],
                       env={"PROVIDER_API_KEY": "k", "PROVIDER_TIMEOUT_MS": "40000",
                            "RECONCILER_LEASE_MS": "600000"}, mention="HEALTH_STALL_MS")
    chargectl_numbers_and_ids()
    chargectl_audit_arguments()
    chargectl_console_arguments()
    auditor_settings_documented()
    admin_addr_unusable()
    secret_never_printed()
    old_librdkafka_refused()


def old_librdkafka_refused():
    """A librdkafka older than 2.10 loaded at run time (LD_LIBRARY_PATH comes
    before the binaries' run path) is refused with exit 2 naming it, rather
    than run with the rebalance bugs 2.10 fixed. Needs the distribution's
    own older librdkafka1 (bookworm's 2.0.2, which kcat depends on)."""
    import ctypes
    import glob
    old = None
    for lib in sorted(glob.glob("/usr/lib/*-linux-gnu/librdkafka.so.1") +
                      glob.glob("/lib/*-linux-gnu/librdkafka.so.1")):
        v = ctypes.CDLL(lib).rd_kafka_version()
        if v < 0x020a00ff:
            old = (lib, v)
            break
    if not old:
        e2e.log("old librdkafka: no librdkafka.so.1 older than 2.10 on this machine; not checked")
        return
    version = "%d.%d.%d" % (old[1] >> 24, (old[1] >> 16) & 0xff, (old[1] >> 8) & 0xff)
    env = {"LD_LIBRARY_PATH": os.path.dirname(old[0]), "PROVIDER_API_KEY": "k"}
    publish = [e2e.CHARGECTL, "publish", "--amount", "100", "--currency", "EUR",
               "--payment-method", "pm_card_visa"]
    for argv in ([e2e.CHARGED, "worker"], [e2e.CHARGED, "relay"], publish):
        expect_usage_error(argv, env=env, mention="librdkafka %s is loaded" % version)
    # A property the old library predates: still the version, not the property.
    expect_usage_error([e2e.CHARGED, "worker"], env=dict(env, KAFKA_GROUP_PROTOCOL="consumer"),
                       mention="librdkafka %s is loaded" % version)
    e2e.log("old librdkafka: %s (%s) refused by the worker, the relay and chargectl publish"
            % (old[0], version))


def chargectl_numbers_and_ids():
    """Every id or number a dlq or attempt command takes is checked whole
    before anything is read: out of range, negative, signed, spaced,
    trailing junk or too long for its type is bad usage (exit 2, one line
    naming the argument), never clamped to something that parses. Kafka
    and PostgreSQL point at a port nobody listens on, so a value let
    through shows as exit 1 instead."""
    with socket.socket() as closed:
        closed.bind(("127.0.0.1", 0))
        port = closed.getsockname()[1]
        env = {"KAFKA_BOOTSTRAP_SERVERS": "127.0.0.1:%d" % port,
               "DATABASE_URL": "postgresql://charged@127.0.0.1:%d/charged" % port}
        huge = "9" * 25
        positions = ["1:" + huge, huge + ":0", "1:9223372036854775808", "2147483648:0",
                     "-1:0", "1:-1", "1:-0", "1:5x", "1x:5", "1:", ":5", "1", "1:2:3",
                     " 1:2", "1: 2", "+1:2", "1:+2", "1:0x10", "1:2 ", ""]
        for pos in positions:
            expect_usage_error([e2e.CHARGECTL, "dlq", "show", pos], env, mention="'%s'" % pos)
            expect_usage_error([e2e.CHARGECTL, "dlq", "replay", "0:1", pos], env,
                               mention="'%s'" % pos)
        uuid = "0b6f1a52-8f5e-4c36-9a39-0f4a7f5a0001"
        for sub in ("list", "replay"):
            for opt, bad in [("--order", "notauuid"), ("--order", uuid + "0"),
                             ("--order", ""), ("--attempt", "notauuid"),
                             ("--attempt", uuid[:-1])]:
                expect_usage_error([e2e.CHARGECTL, "dlq", sub, opt, bad], env,
                                   mention="%s '%s'" % (opt, bad))
        for cmd in (["dlq", "list"], ["attempt", "list"], ["audit", "list"]):
            for bad in ("0", "-1", "+5", " 5", "5 ", "5x", "1e3", "0x10", huge, ""):
                expect_usage_error([e2e.CHARGECTL] + cmd + ["--limit", bad], env,
                                   mention="--limit '%s'" % bad)
        for bad in ("notauuid", uuid + "0", " " + uuid):
            expect_usage_error([e2e.CHARGECTL, "attempt", "show", bad], env, mention="'%s'" % bad)
            expect_usage_error([e2e.CHARGECTL, "attempt", "list", "--order", bad], env,
                               mention="--order '%s'" % bad)
        for opt in ("--since", "--until"):
            for bad in ("yesterday", "1h ", huge + "s", "2026-11-29T18:00:00Zjunk"):
                expect_usage_error([e2e.CHARGECTL, "dlq", "list", opt, bad], env,
                                   mention="%s '%s'" % (opt, bad))
        # Options another subcommand takes are not silently ignored.
        expect_usage_error([e2e.CHARGECTL, "attempt", "show", uuid, "--limit", "5"], env,
                           mention="--limit")
        for extra in (["--limit", "5"], ["--reason", "oversized"], ["--order", uuid]):
            expect_usage_error([e2e.CHARGECTL, "dlq", "show", "0:1"] + extra, env,
                               mention=extra[0])
        for sub in (["list"], ["show", "0:1"]):
            expect_usage_error([e2e.CHARGECTL, "dlq"] + sub + ["--actor", "x"], env,
                               mention="--actor")
        # The actor goes into a header: one line of UTF-8, 1..128 bytes.
        for bad in ("", "a\nb", "x" * 129, "\x7f"):
            expect_usage_error([e2e.CHARGECTL, "dlq", "replay", "0:1", "--actor", bad], env,
                               mention="--actor")
        # The largest values that parse are usage, not refusals: they reach
        # the database (exit 1 here, nothing listens).
        for argv in (["attempt", "list", "--limit", "100000", "--order", uuid.upper()],
                     ["attempt", "show", uuid]):
            p = run([e2e.CHARGECTL] + argv, env)
            e2e.check_eq(p.returncode, 1, "exit status of chargectl %s with no database (%s)"
                         % (" ".join(argv), p.stderr.decode().strip()))


AUDIT_KINDS = ("charged_twice", "charged_unbooked", "booked_not_charged", "amount_mismatch",
               "currency_mismatch", "unknown_intent", "refund_unbooked", "refunded_over_charge",
               "booked_foreign", "foreign_intent", "captured_over_authorized",
               "capture_unbooked", "void_unbooked", "authorization_expired_unvoided")


def chargectl_audit_arguments():
    """chargectl audit checks its arguments whole before it reads anything:
    a duration that is not one, a window that is neither a verdict id nor
    a window start, an option of another subcommand, a missing one: exit 2
    with one line naming it. The database is a closed port, so what is let
    through shows as exit 1."""
    with socket.socket() as closed:
        closed.bind(("127.0.0.1", 0))
        port = closed.getsockname()[1]
        env = {"DATABASE_URL": "postgresql://charged@127.0.0.1:%d/charged" % port,
               "PROVIDER_API_KEY": "k", "PROVIDER_BASE_URL": "http://127.0.0.1:%d" % port}
        audit = [e2e.CHARGECTL, "audit"]
        for bad in ("yesterday", "24", "1h ", " 1h", "24x", "0s", "-1h", "+1h", "1.5h",
                    "9" * 25 + "s", "3651d", ""):
            expect_usage_error(audit + ["run", "--since", bad], env,
                               mention="--since '%s'" % bad)
        for bad in ("later", "1h ", "-1h", "9" * 25 + "s"):
            expect_usage_error(audit + ["run", "--since", "24h", "--until", bad], env,
                               mention="--until '%s'" % bad)
        expect_usage_error(audit + ["run"], env, mention="--since")
        expect_usage_error(audit + ["run", "--since"], env, mention="--since")
        expect_usage_error(audit + ["run", "--since", "1h", "--until", "1h"], env,
                           mention="--until")
        expect_usage_error(audit + ["run", "--since", "1h", "--until", "2h"], env,
                           mention="--until")
        expect_usage_error(audit + ["list", "--since", "1h"], env, mention="--since")
        expect_usage_error(audit + ["show", "1", "--until", "1h"], env, mention="--until")
        expect_usage_error(audit + ["run", "--since", "1h", "--findings"], env,
                           mention="--findings")
        expect_usage_error(audit + ["list", "extra"], env, mention="extra")
        expect_usage_error(audit + ["list", "--bogus"], env, mention="--bogus")
        expect_usage_error(audit + ["show"], env, mention="WINDOW")
        expect_usage_error(audit + ["show", "1", "2"], env, mention="'2'")
        for bad in ("yesterday", "2026-12-01", "2026-12-01T10:00:00", "2026-12-01 10:00:00Z",
                    "2026-12-01T10:00:00Z ", "-1", "1x", "9" * 19):
            expect_usage_error(audit + ["show", bad], env, mention="'%s'" % bad)
        # What parses reaches the database (exit 1 here, nothing listens).
        for argv in (["list", "--findings", "--limit", "100000"],
                     ["show", "2026-12-01T10:00:00Z"], ["show", "9" * 18],
                     ["run", "--since", "3650d", "--until", "90s"]):
            p = run(audit + argv, env)
            e2e.check_eq(p.returncode, 1, "exit status of chargectl audit %s with no database (%s)"
                         % (" ".join(argv), p.stderr.decode().strip()))


def chargectl_console_arguments():
    """chargectl console token checks its arguments whole before it reads
    anything: a missing or unknown subcommand, a missing NAME or --role, a
    role that is neither, a bad name or actor, an option of another
    subcommand: exit 2 with one line naming it. The database is a closed
    port, so what is let through shows as exit 1."""
    with socket.socket() as closed:
        closed.bind(("127.0.0.1", 0))
        port = closed.getsockname()[1]
        env = {"DATABASE_URL": "postgresql://charged@127.0.0.1:%d/charged" % port}
        token = [e2e.CHARGECTL, "console", "token"]
        expect_usage_error([e2e.CHARGECTL, "console"], env, mention="missing subcommand")
        expect_usage_error([e2e.CHARGECTL, "console", "tokens"], env,
                           mention="unknown subcommand 'tokens'")
        expect_usage_error(token, env, mention="missing token subcommand")
        expect_usage_error(token + ["delete", "a"], env, mention="'delete'")
        expect_usage_error(token + ["add"], env, mention="NAME")
        expect_usage_error(token + ["add", "alice"], env, mention="--role")
        expect_usage_error(token + ["add", "alice", "--role"], env, mention="--role")
        for bad in ("admin", "Operator", ""):
            expect_usage_error(token + ["add", "alice", "--role", bad], env,
                               mention="--role '%s'" % bad)
        for bad in ("", "two\nlines", "tab\there", "n" * 129):
            expect_usage_error(token + ["add", bad, "--role", "viewer"], env, mention="NAME")
            expect_usage_error(token + ["revoke", bad], env, mention="NAME")
            expect_usage_error(token + ["add", "alice", "--role", "viewer", "--actor", bad],
                               env, mention="--actor")
        expect_usage_error(token + ["add", "a", "b", "--role", "viewer"], env, mention="'b'")
        expect_usage_error(token + ["add", "alice", "--role", "viewer", "--bogus"], env,
                           mention="--bogus")
        expect_usage_error(token + ["add", "alice", "--role", "viewer", "--actor"], env,
                           mention="--actor")
        expect_usage_error(token + ["list", "extra"], env, mention="extra")
        expect_usage_error(token + ["list", "--role", "viewer"], env, mention="--role")
        expect_usage_error(token + ["list", "--actor", "me"], env, mention="--actor")
        expect_usage_error(token + ["revoke"], env, mention="NAME")
        expect_usage_error(token + ["revoke", "a", "b"], env, mention="'b'")
        expect_usage_error(token + ["revoke", "alice", "--role", "viewer"], env,
                           mention="--role")
        # What parses reaches the database (exit 1 here, nothing listens),
        # and a secret is printed only for a token made.
        for argv in (["add", "alice", "--role", "operator"], ["add", "n" * 128, "--role=viewer",
                                                              "--actor", "ops", "--json"],
                     ["list"], ["list", "--json"], ["revoke", "alice", "--actor", "ops"]):
            p = run(token + argv, env)
            err = p.stderr.decode().strip()
            e2e.check_eq(p.returncode, 1, "exit status of chargectl console token %s with no "
                         "database (%s)" % (" ".join(argv[:2]), err))
            check(err and "\n" not in err, "%s: want one line on stderr, got %r" % (argv, err))
            check("cct_" not in p.stdout.decode(), "%s printed a secret: %r" % (argv, p.stdout))


def auditor_settings_documented():
    """Every setting of the auditor's own that `charged auditor --help`
    prints is a row of docs/configuration.md with the same default, and
    the page names no AUDITOR_ setting the program does not have."""
    out = run([e2e.CHARGED, "auditor", "--help"]).stdout.decode()
    helped = dict(re.findall(r"^  (AUDITOR_[A-Z_]+) .*\[default: ([^\]]*)\]$", out, re.M))
    check(len(helped) >= 5, "charged auditor --help lists %d AUDITOR_ settings: %r" % (
        len(helped), out[-800:]))
    here = os.path.dirname(os.path.abspath(__file__))
    with open(os.path.join(here, "..", "..", "docs", "configuration.md"), encoding="utf-8") as f:
        doc = f.read()
    rows = dict(re.findall(r"^\| `(AUDITOR_[A-Z_]+)` \| `([^`]*)`", doc, re.M))
    for name, default in helped.items():
        check(name in rows, "docs/configuration.md has no row for %s" % name)
        e2e.check_eq(rows[name], default, "docs/configuration.md's default of %s" % name)
    extra = sorted(set(rows) - set(helped))
    check(not extra, "docs/configuration.md documents %s, which charged auditor does not read"
          % extra)


def admin_addr_unusable():
    """The admin listener starts before a role builds anything: an ADMIN_ADDR
    that does not resolve is bad configuration (exit 2), a port another
    process listens on is a runtime failure (exit 1); either way one line
    naming ADMIN_ADDR."""
    for role in ("worker", "reconciler", "relay", "auditor"):
        expect_usage_error([e2e.CHARGED, role], env={
            "PROVIDER_API_KEY": "k", "ADMIN_ADDR": "no-such-host.invalid:9400"},
            mention="ADMIN_ADDR: cannot resolve")
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen(1)
        addr = "127.0.0.1:%d" % taken.getsockname()[1]
        for role in ("worker", "reconciler", "relay", "auditor"):
            p = run([e2e.CHARGED, role], env={"PROVIDER_API_KEY": "k", "ADMIN_ADDR": addr})
            err = p.stderr.decode(errors="replace")
            e2e.check_eq(p.returncode, 1, "exit status of charged %s on a taken ADMIN_ADDR" % role)
            e2e.check_eq(err.strip().splitlines()[-1:],
                         ["charged %s: ADMIN_ADDR: cannot listen on %s: Address already in use"
                          % (role, addr)], "its last stderr line")


SECRET = "sk_live_s3cret"


def worker_output(api_key, worker_id):
    """Everything (stdout and stderr) a worker prints from its start until it
    has logged "worker started" and was stopped by SIGTERM. It needs no
    servers: Kafka and PostgreSQL point at a port bound here but not
    listening, so the worker runs and logs connection errors."""
    with socket.socket() as closed, tempfile.TemporaryFile() as out:
        closed.bind(("127.0.0.1", 0))
        port = closed.getsockname()[1]
        e = {k: v for k, v in os.environ.items()
             if not k.startswith(("KAFKA_", "PROVIDER_", "WORKER_", "DATABASE_URL",
                                  "LOG_LEVEL", "CHARGED_FAILPOINT"))}
        e.update({"PROVIDER_API_KEY": api_key, "WORKER_ID": worker_id,
                  "KAFKA_BOOTSTRAP_SERVERS": "127.0.0.1:%d" % port,
                  "DATABASE_URL": "postgresql://charged@127.0.0.1:%d/charged" % port,
                  "SHUTDOWN_TIMEOUT_MS": "5000", "ADMIN_ADDR": "127.0.0.1:0"})
        p = subprocess.Popen([e2e.CHARGED, "worker"], stdout=out, stderr=out, env=e)
        try:
            def started():
                out.seek(0)
                text = out.read().decode(errors="replace")
                if '"worker started"' in text:
                    return True
                check(p.poll() is None, "the worker exited %s before it logged "
                      "'worker started': %s" % (p.returncode, text[-1000:]))
                return False
            e2e.wait_until("the worker's 'worker started' line", started, 30, 0.05)
            p.send_signal(signal.SIGTERM)
            p.wait(timeout=e2e.scaled(30))
        finally:
            if p.poll() is None:
                p.kill()
                p.wait(timeout=e2e.scaled(30))
        out.seek(0)
        return out.read().decode(errors="replace")


def secret_never_printed():
    """A secret's value is replaced in every log line, wherever it shows up.
    The worker logs its WORKER_ID ("worker started", librdkafka's client
    id); a WORKER_ID that embeds the API key's value must come out with the
    key redacted. A control run whose API key is something else proves that
    the same probe does see that value when it is not a secret, so the check
    cannot pass just because the value never reached the output."""
    probe_id = SECRET + "-probe"
    control = worker_output("sk_test_other_key", probe_id)
    check(probe_id in control, "control run: the worker never printed its WORKER_ID %r, so "
          "the probe below could not see a leak; output: %s" % (probe_id, control[-1500:]))
    got = worker_output(SECRET, probe_id)
    leaks = [l for l in got.splitlines() if SECRET in l]
    check(not leaks, "the API key's value shows in %d output lines, e.g. %s" % (
        len(leaks), leaks[:2]))
    check("[redacted]-probe" in got, "the WORKER_ID line was not logged with the secret "
          "redacted ('[redacted]-probe'); output: %s" % got[-1500:])
    e2e.log("secret probe: control run printed the value %d times; with it as the API key, "
            "0 times and '[redacted]-probe' %d times" % (
                control.count(SECRET), got.count("[redacted]-probe")))

    # A malformed key is refused without quoting it.
    p = run([e2e.CHARGED, "worker"], env={"PROVIDER_API_KEY": SECRET + "\r\nX-Injected: 1"})
    err = (p.stdout + p.stderr).decode(errors="replace")
    check(p.returncode == 2 and "api key" in err, "a malformed PROVIDER_API_KEY: exit %d, "
          "want 2 with an error naming the api key; output %r" % (p.returncode, err))
    check(SECRET not in err, "the refused API key is quoted in the error: %r" % err)


if __name__ == "__main__":
    sys.exit(e2e.main(scenario))
