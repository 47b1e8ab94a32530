#!/usr/bin/env python3
"""A statement given up at its deadline may still commit: nothing is written twice.

The worker gives a statement up DATABASE_TIMEOUT_MS + 1 s after sending it
when its server does not answer, and closes the session. A server that was
frozen while the session sat idle has not begun the statement yet: when it
runs again, it reads the statement from its socket, runs it and commits,
whatever the client decided meanwhile. Every statement the worker sends
again after giving one up must therefore be safe to apply twice.

Forced here: the provider answering after 1 s, a first command settles, so
that the session of the worker's persist lane (docs/worker.md: the calls'
log and the outcomes) is open and idle after its persist. A second command
is published; once it is claimed, that backend is stopped with SIGSTOP, so
the next statement of that session (the write of the second command's
provider call to provider_calls, sent when the answer comes) is given up.
Once the worker has logged that, the backend is continued and the worker
writes again on a new session. Then, for the second command:
  - the attempt is SUCCEEDED and psp-sim charged it once;
  - provider_calls holds one row per call the worker made (docs/schema.md:
    "One row per call"), as many as its "provider answered" lines.

The backend is continued in a finally block whatever happens."""
import os
import signal

import charged_e2e as e2e

DB_TIMEOUT_MS = 1000
# The statement that persists outcomes (attempt_store.c): the persist lane's
# last, after the first command settled.
PERSIST_SQL = "WITH v AS (  SELECT * FROM unnest($1::uuid[], $2::bigint[], $3::text[]%"


def scenario(new):
    e2e.stack_check()
    s = new("db_given_up_commits", psp_args=["--latency-ms", "1000"],
            worker_env={"WORKER_LEASE_MS": "60000"})
    w = s.start_worker(DATABASE_TIMEOUT_MS=DB_TIMEOUT_MS)
    first = e2e.new_command()
    s.publish([first])
    s.wait_settled(1, timeout=60)

    def idle_after_persist():
        rows = s.query("SELECT pid FROM pg_stat_activity WHERE datname = current_database()"
                       " AND pid <> pg_backend_pid() AND state = 'idle'"
                       " AND query LIKE '%s'" % PERSIST_SQL)
        return int(rows[0][0]) if len(rows) == 1 else None
    pid = e2e.wait_until("the persist lane's session idle after its persist",
                         idle_after_persist, 10, interval=0.02)
    cmd = e2e.new_command()
    aid = cmd["payment_attempt_id"]
    s.publish([cmd])
    e2e.wait_until("the attempt claimed", lambda: s.query(
        "SELECT status FROM payment_attempts WHERE id = '%s'" % aid) == [["PROCESSING"]],
        60, interval=0.02)
    given_up = lambda: [l for l in s.worker_log(w, "database step failed")
                        if "did not answer within" in l.get("error", "")]
    try:
        e2e.freeze(pid)
        e2e.log("stopped backend %d of the worker's session" % pid)
        e2e.wait_until("a statement given up at its deadline", given_up, 30)
        e2e.log("given up: %s" % given_up()[0])
    finally:
        os.kill(pid, signal.SIGCONT)

    s.wait_settled(2, timeout=60)
    e2e.check_eq(s.query("SELECT status FROM payment_attempts WHERE id = '%s'" % aid),
                 [["SUCCEEDED"]], "the attempt's status")
    s.check_invariants()
    charges = [c for c in s.ledger() if c["payment_attempt_id"] == aid]
    e2e.check_eq(len(charges), 1, "psp-sim's charges of the attempt")
    answered = [l for l in s.worker_log(w, "provider answered")
                if l.get("payment_attempt_id") == aid]
    e2e.log("the worker's provider calls: %d" % len(answered))
    rows = int(s.query("SELECT count(*) FROM provider_calls WHERE payment_attempt_id = '%s'"
                       % aid)[0][0])
    e2e.check_eq(rows, len(answered), "rows of provider_calls, one per call the worker made")


if __name__ == "__main__":
    raise SystemExit(e2e.main(scenario))
