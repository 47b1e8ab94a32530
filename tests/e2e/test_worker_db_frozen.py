#!/usr/bin/env python3
"""PostgreSQL frozen: a statement costs one deadline, never the loop.

An outside attack stopped PostgreSQL with SIGSTOP (the postmaster and its
backends): TCP stays open and the kernel acknowledges what a client sends,
but nothing answers, so a statement waited for as long as the kernel let
it and /readyz said 200 until the loop counted as stalled
(HEALTH_STALL_MS). Now every statement of a store is given up
DATABASE_TIMEOUT_MS + 1 s after it was sent (docs/configuration.md).

With calls in flight and a backlog published, PostgreSQL's whole process
tree is frozen:
  - the worker's and the api's /readyz turn 503 within a bound derived
    from DATABASE_TIMEOUT_MS (one deadline, the longest a role goes without
    a statement, and slack), and the worker says a statement ran past its
    deadline, not that its loop stalled (HEALTH_STALL_MS is set far beyond
    the bound);
  - a status query to the api answers 503 within the same bound instead of
    hanging;
then PostgreSQL is thawed: both are ready again, every command is
SUCCEEDED and committed, and psp-sim's ledger shows each charged once.

PostgreSQL is thawed in a finally block whatever happens."""
import json
import time
import urllib.error
import urllib.request
import uuid

import charged_api as api
import charged_e2e as e2e

DB_TIMEOUT_MS = 1000
# The client gives a statement up this long after the server's own
# statement_timeout (DATABASE_TIMEOUT_MS) would have ended it.
DEADLINE_GRACE_MS = 1000
# The longest either role goes without a statement while PostgreSQL
# answers: the worker's idle ping (DB_PING_MS, worker/roles/worker.c), the api's
# probe every 2 s (PROBE_INTERVAL_MS, worker/roles/api.c).
QUIET_S = 5.0
# A role that must open a new session first waits up to connect_timeout.
CONNECT_S = 3.0
SLACK_S = 2.0
DEADLINE_S = (DB_TIMEOUT_MS + DEADLINE_GRACE_MS) / 1000.0
# The bounds under test: not stretched by CHARGED_TEST_TIMEOUT_SCALE.
NOT_READY_WITHIN_S = QUIET_S + DEADLINE_S + SLACK_S
ANSWER_WITHIN_S = CONNECT_S + DEADLINE_S + SLACK_S
STALL_MS = 120000  # far beyond every bound here: a stall cannot pass for the fix
COMMANDS = 20


def readyz(port):
    """The status of GET /readyz on an admin port, within 2 s (the admin
    listener answers from its own thread, whatever the loop is doing)."""
    try:
        with urllib.request.urlopen("http://127.0.0.1:%d/readyz" % port, timeout=2) as r:
            return r.status
    except urllib.error.HTTPError as e:
        return e.code


def wait_status(what, ports, want, within):
    """Polls every port's /readyz until each has answered `want` once, or
    `within` seconds pass (unscaled: the bound under test). Returns the
    seconds each took."""
    t0 = time.monotonic()
    took = {}
    while True:
        for name, port in ports.items():
            if name not in took and readyz(port) == want:
                took[name] = time.monotonic() - t0
        if len(took) == len(ports):
            return took
        if time.monotonic() - t0 >= within:
            raise e2e.Failure("%s: %s did not answer %d within %.1fs (answered so far: %s)"
                              % (what, sorted(set(ports) - set(took)), want, within, took))
        time.sleep(0.1)


def status_query_status(port, attempt_id, within):
    """The status of a status query, which must come back within `within`
    seconds (the client waits a little longer, to see how late it is)."""
    t0 = time.monotonic()
    try:
        st, _ = api.request(port, "GET", "/v1/payment-attempts/%s" % attempt_id,
                            timeout=within + 30)[:2]
    except OSError as e:
        raise e2e.Failure("status query failed after %.1fs: %s" % (time.monotonic() - t0, e))
    took = time.monotonic() - t0
    e2e.check(took <= within, "a status query took %.1fs with PostgreSQL frozen (bound %.1fs)"
              % (took, within))
    return st, took


def scenario(new):
    e2e.stack_check()
    env = {"DATABASE_TIMEOUT_MS": DB_TIMEOUT_MS, "HEALTH_STALL_MS": STALL_MS}
    # Calls take 400 ms, so that some are in flight when PostgreSQL stops.
    s = new("db_frozen", psp_args=["--latency-ms", "400"],
            worker_env={"WORKER_LEASE_MS": "60000"})
    w = s.start_worker(**env)
    a, api_port = api.start_api(s, **env)
    warm = e2e.new_command()
    s.publish([warm])
    e2e.wait_until("the worker's first charge", lambda: s.query(
        "SELECT status FROM payment_attempts WHERE id = '%s'" % warm["payment_attempt_id"])
        == [["SUCCEEDED"]], 60)
    ports = {w: s.admin_port(w), a: s.admin_port(a)}
    wait_status("before the freeze", ports, 200, e2e.scaled(30))

    cmds = [e2e.new_command() for _ in range(COMMANDS)]
    ids = [c["payment_attempt_id"] for c in cmds]
    s.publish(cmds)
    e2e.wait_until("provider calls in flight", lambda: int(s.query(
        "SELECT count(*) FROM payment_attempts WHERE status = 'PROCESSING'")[0][0]) >= 3,
        30, interval=0.05)
    try:
        e2e.pg_freeze()
        took = wait_status("PostgreSQL frozen", ports, 503, NOT_READY_WITHIN_S)
        e2e.log("not ready after %s (bound %.1fs)" % (
            ", ".join("%s %.1fs" % kv for kv in sorted(took.items())), NOT_READY_WITHIN_S))
        st, q = status_query_status(api_port, ids[0], ANSWER_WITHIN_S)
        e2e.check_eq(st, 503, "status of a status query with PostgreSQL frozen")
        e2e.log("status query answered %d after %.1fs (bound %.1fs)" % (st, q, ANSWER_WITHIN_S))
        for name in ports:
            e2e.check(s.process(name).poll() is None,
                      "%s exited while PostgreSQL was frozen" % name)
    finally:
        e2e.pg_thaw()
        e2e.stack_restore()

    # Why the worker is not ready: a statement past its deadline, logged
    # as a failed database step.
    failed = [l for l in s.worker_log(w, "database step failed")
              if "did not answer within" in l.get("error", "")]
    e2e.check(failed, lambda: "the worker logged no statement past its deadline; its "
              "database lines: %s" % json.dumps(s.worker_log(w, "database"))[:2000])
    e2e.log("worker: %d database steps given up at their deadline, first: %s"
            % (len(failed), failed[0]["error"]))

    wait_status("PostgreSQL thawed", ports, 200, e2e.scaled(30))
    st, _ = api.get(api_port, "/v1/payment-attempts/%s" % uuid.uuid4())
    e2e.check_eq(st, 404, "status query of an unknown attempt after the thaw")
    s.wait_settled(COMMANDS + 1, timeout=90)
    done = int(s.query("SELECT count(*) FROM payment_attempts WHERE status = 'SUCCEEDED' "
                       "AND id IN (%s)" % ",".join("'%s'" % i for i in ids))[0][0])
    e2e.check_eq(done, COMMANDS, "commands SUCCEEDED after the thaw")
    s.check_invariants()
    charged = [c for c in s.ledger() if c["payment_attempt_id"] in set(ids)]
    e2e.check_eq(len(charged), COMMANDS, "provider charges of the commands")


if __name__ == "__main__":
    raise SystemExit(e2e.main(scenario))
