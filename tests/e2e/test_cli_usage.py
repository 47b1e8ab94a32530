#!/usr/bin/env python3
"""Every program prints usage on --help (exit 0), and says why in one line on
stderr with exit 2 on bad usage or configuration. psp-sim's --help documents
every flag, fault kind and admin endpoint. Needs no servers."""
import os
import subprocess
import sys

import charged_e2e as e2e


def run(argv, env=None):
    e = {k: v for k, v in os.environ.items()
         if not k.startswith(("KAFKA_", "PROVIDER_", "WORKER_", "DATABASE_URL", "LOG_LEVEL"))}
    e.update(env or {})
    return subprocess.run(argv, capture_output=True, env=e, timeout=30)


def expect_help(argv, must=()):
    p = run(argv)
    out = p.stdout.decode()
    assert p.returncode == 0 and "usage" in out, (argv, p.returncode, out[:200])
    for word in must:
        assert word in out, (argv, word)


def expect_usage_error(argv, env=None, mention=None):
    p = run(argv, env)
    err = p.stderr.decode().strip()
    assert p.returncode == 2, (argv, env, p.returncode, err)
    assert err and "\n" not in err, (argv, err)
    if mention:
        assert mention in err, (argv, err)


def scenario(_new):
    expect_help([e2e.CHARGED, "--help"], ["worker", "reconciler", "relay", "api"])
    expect_help([e2e.CHARGED, "worker", "--help"],
                ["KAFKA_BOOTSTRAP_SERVERS", "PROVIDER_API_KEY", "WORKER_MAX_IN_FLIGHT",
                 "WORKER_LEASE_MS", "SHUTDOWN_TIMEOUT_MS"])
    expect_help([e2e.CHARGECTL, "--help"], ["migrate", "publish", "dlq", "attempt"])
    expect_help([e2e.CHARGECTL, "migrate", "--help"], ["--dir"])
    expect_help([e2e.CHARGECTL, "publish", "--help"],
                ["--attempt-id", "--order-id", "--idempotency-key", "--amount", "--currency",
                 "--payment-method", "--customer-id", "--metadata", "--file", "--json"])
    expect_help([e2e.PSP_SIM, "--help"],
                ["--host", "--port", "--admin-port", "--api-key", "--key-retention-ms",
                 "--threads", "--max-connections", "--seed", "--latency-ms",
                 "--latency-jitter-ms", "--stall-ms", "--fault", "error_before", "rate_limit",
                 "error_after", "stall_after", "drop_after", "/health", "/ledger", "/reset",
                 "/faults", "/retention"])

    expect_usage_error([e2e.CHARGED], mention="missing role")
    expect_usage_error([e2e.CHARGECTL, "dlq"], mention="missing subcommand")
    expect_usage_error([e2e.CHARGECTL, "attempt", "list", "--bogus"], mention="--bogus")
    expect_usage_error([e2e.CHARGED, "nonsense"], mention="unknown role")
    expect_usage_error([e2e.CHARGECTL, "nonsense"], mention="unknown command")
    expect_usage_error([e2e.CHARGECTL, "migrate", "--bogus"])
    expect_usage_error([e2e.PSP_SIM, "--port", "0"], mention="--port")
    expect_usage_error([e2e.PSP_SIM, "--fault", "explode=1"], mention="--fault")
    expect_usage_error([e2e.CHARGED, "worker"], mention="PROVIDER_API_KEY")
    expect_usage_error([e2e.CHARGED, "worker"],
                       env={"PROVIDER_API_KEY": "k", "LOG_LEVEL": "verbose"}, mention="LOG_LEVEL")
    expect_usage_error([e2e.CHARGED, "worker"],
                       env={"PROVIDER_API_KEY": "k", "WORKER_LEASE_MS": "5000",
                            "PROVIDER_TIMEOUT_MS": "10000"}, mention="WORKER_LEASE_MS")
    expect_usage_error([e2e.CHARGECTL, "publish", "--amount", "0", "--currency", "EUR",
                        "--payment-method", "pm_card_visa"], mention="amount")
    # A secret given on the command line's environment never shows in an error.
    p = run([e2e.CHARGED, "worker"], env={"PROVIDER_API_KEY": "sk_live_s3cret",
                                          "WORKER_LEASE_MS": "1"})
    assert b"sk_live_s3cret" not in p.stderr + p.stdout, p.stderr


if __name__ == "__main__":
    sys.exit(e2e.main(scenario))
