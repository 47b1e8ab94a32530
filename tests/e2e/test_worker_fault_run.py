#!/usr/bin/env python3
"""A backlog of originals and conflicting resends survives a broker SIGKILL
and a PostgreSQL immediate stop.

1,200 original commands and 80 conflicting resends (the same
payment_attempt_id and order_id as an original, but another idempotency_key
or another amount, published after the original under the same Kafka key:
same partition, later offset; some in the same produce call right behind
their original, so that both land in one fetched batch, the others later)
go through three workers while psp-sim answers with 5-20 ms latency and some
faults. While they consume, the broker is killed with SIGKILL and restarted,
then PostgreSQL is stopped with `-m immediate` for longer than
WORKER_LEASE_MS and restarted. A worker that exits on its own is restarted
(and logged), and counts against the run: workers must ride out both faults.

Then: every resend is a dead letter `idempotency_key_conflict` and no
original is; every stored attempt has its original's key and amount; every
attempt is settled (nothing PENDING, nothing PROCESSING under a lease); no
resend key was charged; check_invariants (no key charged twice, SUCCEEDED
matches the ledger, offsets committed to the end); no worker exited on its
own."""
import json
import random
import time

import charged_e2e as e2e
from charged_e2e import check

N = 1200
WORKERS = 3
LEASE_MS = 6000
SETTLE_DEADLINE_S = 150

WORKER_ENV = {
    # lease 6000 > timeout 1000 * (2 + 1) + retry max 500 * 2
    "WORKER_LEASE_MS": str(LEASE_MS),
    "PROVIDER_TIMEOUT_MS": "1000",
    "WORKER_UNKNOWN_RETRIES": "2",
    "WORKER_RETRY_MAX_MS": "500",
}


class Fleet:
    """Keeps WORKERS workers running; records every exit it did not cause."""

    def __init__(self, s):
        self.s = s
        self.phase = "starting"
        self.exits = []
        self.next_start = 0.0

    def start(self):
        while len(self.s.workers) < WORKERS:
            self.s.start_worker()

    def check(self):
        for name, rc in self.s.exited_workers():
            self.exits.append((name, rc, self.phase))
            e2e.log("worker %s exited on its own with status %s while %s; restarting it"
                    % (name, rc, self.phase))
        # At most one restart a second, so a worker that cannot start does not spin.
        if len(self.s.workers) < WORKERS and time.monotonic() >= self.next_start:
            self.s.start_worker()
            self.next_start = time.monotonic() + 1.0

    def hold(self, seconds):
        """Keeps a fault active for a while, watching the workers meanwhile."""
        end = time.monotonic() + seconds
        while time.monotonic() < end:
            self.check()
            time.sleep(0.2)


def resend_of(original, i):
    """A conflicting resend: same attempt, order and Kafka key, other parameters."""
    if i % 2 == 0:
        return dict(original, idempotency_key=original["idempotency_key"] + ":resent")
    return dict(original, amount=original["amount"] + 1)


def with_inline_resends(originals, chosen, resends):
    """originals in order, each chosen one followed at once by its resend."""
    out = []
    for c in originals:
        out.append(c)
        if c["payment_attempt_id"] in chosen:
            r = resend_of(c, len(resends))
            resends.append(r)
            out.append(r)
    return out


def settled_count(s):
    return int(s.query("SELECT count(*) FROM payment_attempts WHERE status <> 'PENDING' "
                       "AND NOT (status = 'PROCESSING' AND lease_owner IS NOT NULL)")[0][0])


def ident(cmd):
    return (cmd["payment_attempt_id"], cmd["idempotency_key"], int(cmd["amount"]))


def scenario(new):
    t_start = time.monotonic()
    e2e.stack_check()
    s = new("fault_run", worker_env=WORKER_ENV, psp_args=[
        "--seed", "23", "--latency-ms", "5", "--latency-jitter-ms", "15",
        "--fault", "drop_after=0.05", "--fault", "error_after=0.03",
        "--fault", "error_before=0.03"])
    rnd = random.Random(17)
    originals = [e2e.new_command() for _ in range(N)]
    parts = [originals[:500], originals[500:800], originals[800:1000], originals[1000:]]
    resends = []
    fleet = Fleet(s)
    try:
        # 1. A backlog before any worker runs, then the workers, then more.
        inline = {c["payment_attempt_id"] for c in rnd.sample(parts[0], 25)}
        s.publish(with_inline_resends(parts[0], inline, resends))
        fleet.start()
        inline = {c["payment_attempt_id"] for c in rnd.sample(parts[1], 15)}
        s.publish(with_inline_resends(parts[1], inline, resends))
        e2e.log("published", 800, "originals and", len(resends), "inline resends")

        # 2. The broker dies while the workers consume.
        e2e.wait_until("100 attempts settled before the broker kill",
                       lambda: fleet.check() or settled_count(s) >= 100, 90, interval=0.05)
        e2e.log("settled before the broker kill:", settled_count(s))
        fleet.phase = "the broker was down"
        e2e.kafka_kill()
        fleet.hold(3)
        e2e.kafka_start()
        fleet.phase = "the broker was back"
        e2e.log("settled after the broker came back:", settled_count(s))

        # 3. More backlog, then PostgreSQL goes away for longer than a lease;
        #    the rest of the backlog and the late resends (of originals
        #    published earlier) are published while it is down.
        inline = {c["payment_attempt_id"] for c in rnd.sample(parts[2], 8)}
        s.publish(with_inline_resends(parts[2], inline, resends))
        e2e.log("published", len(parts[2]), "more originals; settled so far:", settled_count(s))
        fleet.phase = "PostgreSQL was down"
        e2e.pg_stop_immediate()
        t_down = time.monotonic()
        inline = {c["payment_attempt_id"] for c in rnd.sample(parts[3], 7)}
        s.publish(with_inline_resends(parts[3], inline, resends))
        has_resend = {r["payment_attempt_id"] for r in resends}
        late_of = rnd.sample([c for c in originals if c["payment_attempt_id"] not in has_resend],
                             25)
        late = [resend_of(c, len(resends) + i) for i, c in enumerate(late_of)]
        resends.extend(late)
        s.publish(late)
        e2e.log("published the last", len(parts[3]), "originals and", len(late),
                "late resends while PostgreSQL is down")
        fleet.hold(LEASE_MS / 1000.0 + 2 - (time.monotonic() - t_down))
        e2e.pg_start()
        e2e.log("PostgreSQL was down for %.1fs" % (time.monotonic() - t_down))
        fleet.phase = "PostgreSQL was back"
    finally:
        e2e.stack_restore()
    check(len(resends) == 80, "the test built %d resends, not 80" % len(resends))

    # 4. Everything settles, with workers restarted if they died.
    problems = []
    try:
        s.wait_settled(N, timeout=SETTLE_DEADLINE_S, each=fleet.check)
    except e2e.Failure as e:
        rows = s.query("SELECT status, count(*) FROM payment_attempts GROUP BY 1")
        problems.append("%s (attempts %s, lag %s)" % (
            e, dict((r[0], int(r[1])) for r in rows), s.lag()["lag"]))
    fleet.check()
    e2e.log("stopped waiting for the settle %.0fs into the run" % (time.monotonic() - t_start))

    # Dead letters: each resend is one, with the conflict reason; no original is.
    letters = s.dead_letters()
    conflicts = {}
    by_ident = {ident(c): "original" for c in originals}
    by_ident.update({ident(r): "resend" for r in resends})
    for d in letters:
        headers = dict((h[0], h[1]) for h in d["headers"])
        reason = headers.get("dlq.reason")
        try:
            cmd = json.loads(d["value"])
            key = ident(cmd)
        except (TypeError, ValueError, KeyError):
            problems.append("dead letter with an unreadable value: %s" % d)
            continue
        what = by_ident.get(key)
        if what == "original":
            problems.append("original %s was dead-lettered (%s)" % (key, reason))
        elif what is None:
            problems.append("dead letter of a command never published: %s" % (key,))
        elif reason != "idempotency_key_conflict":
            problems.append("resend %s dead-lettered as %s" % (key, reason))
        elif d.get("key") != cmd["payment_attempt_id"]:
            problems.append("dead letter of %s has Kafka key %r" % (key, d.get("key")))
        else:
            conflicts[key] = conflicts.get(key, 0) + 1
    missing = [ident(r) for r in resends if ident(r) not in conflicts]
    if missing:
        late_ids = {ident(r) for r in late}
        problems.append("%d of %d resends have no idempotency_key_conflict dead letter "
                        "(%d published right behind their original, %d later), e.g. %s" % (
                            len(missing), len(resends),
                            len([m for m in missing if m not in late_ids]),
                            len([m for m in missing if m in late_ids]), missing[:3]))
    again = sum(n - 1 for n in conflicts.values())
    e2e.log("dead letters:", len(letters), "conflicts matched:", len(conflicts),
            "dead-lettered again after a redelivery:", again)

    # The stored attempts are the originals, untouched by their resends.
    stored = {a["id"]: a for a in s.attempts()}
    wrong = []
    for c in originals:
        a = stored.get(c["payment_attempt_id"])
        if not a or a["key"] != c["idempotency_key"] or int(a["amount"]) != c["amount"]:
            wrong.append((c["payment_attempt_id"], a and (a["key"], a["amount"])))
    if wrong:
        problems.append("%d attempts missing or not as first sent, e.g. %s" % (
            len(wrong), wrong[:3]))
    open_ = s.query("SELECT id, status, lease_owner, lease_expires_at > now() "
                    "FROM payment_attempts WHERE status = 'PENDING' OR "
                    "(status = 'PROCESSING' AND lease_owner IS NOT NULL)")
    if open_:
        problems.append("%d attempts not settled, e.g. %s" % (len(open_), open_[:3]))

    # No resend's parameters reached the provider under an original's key.
    review = [a for a in stored.values() if a["status"] == "REQUIRES_REVIEW"]
    if review:
        problems.append("%d attempts REQUIRES_REVIEW (a key sent with other parameters?), "
                        "e.g. %s" % (len(review), review[:2]))
    ledger = s.ledger()
    amount_of = {c["idempotency_key"]: c["amount"] for c in originals}
    other_amount = [c for c in ledger if c["idempotency_key"] in amount_of
                    and int(c["amount"]) != amount_of[c["idempotency_key"]]]
    if other_amount:
        problems.append("charged with a resend's amount: %s" % other_amount[:3])
    resend_keys = {r["idempotency_key"] for r in resends} - {c["idempotency_key"] for c in originals}
    charged_resends = [c for c in ledger if c["idempotency_key"] in resend_keys]
    if charged_resends:
        problems.append("resend keys charged at the provider: %s" % charged_resends[:3])
    try:
        s.check_invariants()
    except e2e.Failure as e:
        problems.append("invariants: %s" % e)
    # The auditor's word too, from psp-sim's own books.
    try:
        s.check_audited()
    except e2e.Failure as e:
        problems.append("audit: %s" % e)
    if fleet.exits:
        problems.append("workers exited on their own: %s" % ", ".join(
            "%s status %s while %s" % x for x in fleet.exits))
    e2e.log("whole run took %.0fs" % (time.monotonic() - t_start))
    if problems:
        raise e2e.Failure("\n  - " + "\n  - ".join(problems))


if __name__ == "__main__":
    raise SystemExit(e2e.main(scenario))
