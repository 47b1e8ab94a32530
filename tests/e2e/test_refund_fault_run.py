#!/usr/bin/env python3
"""A fault run of charges and refunds: 2,000 charges, then 800 refunds
(partial, full, over-refund attempts, second refunds that would pass the
charge, refunds of declined charges, duplicate deliveries, conflicting
resends), through three workers and a reconciler, while psp-sim drops and
fails some answers (before and after executing), a random worker is killed
with SIGKILL every few seconds and restarted, and the broker is killed and
restarted while the refunds run.

Counted at the end from psp-sim's ledger: no refund key executed twice, no
charge refunded beyond its amount, every SUCCEEDED refund exactly one
provider refund; nothing UNKNOWN or in flight is left; every dead letter
has its reason (the conflicting resends idempotency_key_conflict, each
once, leaving the first refund untouched); the charges' invariants hold."""
import json
import random
import signal
import time

import charged_e2e as e2e
from charged_e2e import check, check_eq

CHARGES = 2000
DECLINED = 100
WORKERS = 3
KILL_EVERY_S = 4.0
WORKER_ENV = {
    "WORKER_LEASE_MS": "6000",
    "PROVIDER_TIMEOUT_MS": "1000",
    "WORKER_UNKNOWN_RETRIES": "2",
    "WORKER_RETRY_MAX_MS": "500",
}
RECONCILER_ENV = {"RECONCILER_SCHEDULE_MS": "200", "RECONCILER_POLL_MS": "100",
                  "RECONCILER_BATCH": "64", "RECONCILER_FIRST_LOOK_MS": "500",
                  "RECONCILER_STALE_LEASE_MS": "1000"}


class Fleet:
    """WORKERS workers and one reconciler kept running, a random worker
    killed every KILL_EVERY_S while `killing`."""

    def __init__(self, s, rnd):
        self.s, self.rnd = s, rnd
        self.killing = False
        self.kills = 0
        self.next_kill = time.monotonic() + KILL_EVERY_S
        self.own_exits = []
        self.progress_kills = 0

    def tick(self):
        for name, rc in self.s.exited_workers():
            self.own_exits.append((name, rc))
        while len(self.s.workers) < WORKERS:
            self.s.start_worker()
        if not any(p.poll() is None for p in self.s.reconcilers.values()):
            self.s.start_reconciler(**RECONCILER_ENV)
        if self.killing and time.monotonic() >= self.next_kill:
            self.kill_one()

    def kill_one(self):
        if self.s.workers:
            victim = self.rnd.choice(sorted(self.s.workers))
            self.s.kill_worker(victim, signal.SIGKILL)
            self.kills += 1
        self.next_kill = time.monotonic() + KILL_EVERY_S

    def at_progress(self, done, total):
        """Kills one worker each time another fifth of the work is settled:
        on a fast machine the work outruns KILL_EVERY_S, and kills by the
        clock alone landed after it (3 of 5 once)."""
        while self.killing and total and done * 5 >= (self.progress_kills + 1) * total \
                and self.progress_kills < 4:
            self.progress_kills += 1
            self.kill_one()

    def new_phase(self):
        self.progress_kills = 0

    def hold(self, seconds):
        end = time.monotonic() + seconds
        while time.monotonic() < end:
            self.tick()
            time.sleep(0.2)


def charges_settled(s, fleet=None):
    """Every charge recorded, and none PENDING, PROCESSING or UNKNOWN."""
    total, open_ = s.query("SELECT count(*), count(*) FILTER (WHERE status IN"
                           " ('PENDING', 'PROCESSING', 'UNKNOWN')) FROM payment_attempts")[0]
    if fleet:
        fleet.at_progress(int(total) - int(open_), CHARGES)
    return int(total) == CHARGES and int(open_) == 0


def open_refunds(s):
    return int(s.query("SELECT count(*) FROM refund_attempts WHERE status IN"
                       " ('PENDING', 'PROCESSING', 'UNKNOWN')")[0][0])


def build_refunds(rnd, paid, declined):
    """800 refund commands and what each is, and the conflicting resends."""
    rnd.shuffle(paid)
    cmds, kinds = [], {}

    def add(cmd, kind):
        cmds.append(cmd)
        kinds[cmd["refund_id"]] = kind

    for c in paid[:300]:  # partial, then a second one that would pass the charge
        add(e2e.new_refund(c, c["amount"] // 2), "partial")
    for c in paid[:100]:
        add(e2e.new_refund(c, c["amount"] - c["amount"] // 2 + 1), "second_over")
    for c in paid[300:500]:
        add(e2e.new_refund(c, c["amount"], reason="duplicate"), "full")
    for c in paid[500:600]:
        add(e2e.new_refund(c, c["amount"] + 1), "over")
    for c in declined[:50]:
        add(e2e.new_refund(c, 100), "not_refundable")
    for c in paid[600:650]:
        add(e2e.new_refund(c, 100, reason="fraudulent"), "small")
    check_eq(len(cmds), 800, "refund commands built")
    dups = rnd.sample([c for c in cmds if kinds[c["refund_id"]] in ("partial", "full")], 60)
    conflicts = [dict(c, amount=c["amount"] - 1) for c in rnd.sample(
        [c for c in cmds if kinds[c["refund_id"]] == "partial"], 40)]
    return cmds, kinds, dups, conflicts


def scenario(new):
    e2e.stack_check()
    rnd = random.Random(31)
    s = new("refund_fault_run", worker_env=WORKER_ENV, psp_args=[
        "--seed", "41", "--latency-ms", "5", "--latency-jitter-ms", "15",
        "--fault", "drop_after=0.03", "--fault", "error_after=0.02",
        "--fault", "error_before=0.03"])
    charges = [e2e.new_command(amount=rnd.randint(200, 50000)) for _ in range(CHARGES - DECLINED)]
    declined = [e2e.new_command(amount=1000, payment_method="pm_card_chargeDeclined")
                for _ in range(DECLINED)]
    fleet = Fleet(s, rnd)
    try:
        # 1. The charges, with kills, until every one is settled.
        s.publish(charges + declined)
        fleet.killing = True
        e2e.wait_until("every charge settled", lambda: fleet.tick() or charges_settled(s, fleet),
                       240, 0.5)
        status = dict((r[0], r[1]) for r in s.query("SELECT id, status FROM payment_attempts"))
        paid = [c for c in charges if status.get(c["payment_attempt_id"]) == "SUCCEEDED"]
        check(len(paid) >= 1000, "only %d charges SUCCEEDED" % len(paid))
        e2e.log("charges settled:", len(paid), "paid; kills so far", fleet.kills)

        # 2. The refunds, with kills and a broker restart while they run.
        refunds, kinds, dups, conflicts = build_refunds(rnd, paid, declined)
        s.publish(refunds[:400] + dups[:30])
        e2e.wait_until("100 refunds settled before the broker kill", lambda: fleet.tick() or int(
            s.query("SELECT count(*) FROM refund_attempts WHERE status NOT IN"
                    " ('PENDING', 'PROCESSING')")[0][0]) >= 100, 120, 0.2)
        e2e.kafka_kill()
        fleet.hold(3)
        e2e.kafka_start()
        e2e.log("broker back; kills so far", fleet.kills)
        s.publish(refunds[400:] + dups[30:] + conflicts)
        fleet.new_phase()

        def refunds_recorded():
            n = int(s.query("SELECT count(*) FROM refund_attempts")[0][0])
            fleet.at_progress(n, len(refunds))
            return n >= len(refunds)
        e2e.wait_until("every refund recorded", lambda: fleet.tick() or refunds_recorded(),
                       240, 0.2)
        fleet.killing = False
        e2e.wait_until("every refund settled", lambda: fleet.tick() or open_refunds(s) == 0,
                       240, 0.5)
        e2e.wait_until("every command consumed", lambda: fleet.tick() or s.lag()["lag"] == 0,
                       120, 0.5)
    finally:
        e2e.stack_restore()
    e2e.log("kills:", fleet.kills, "workers that exited on their own:", fleet.own_exits)
    check(fleet.kills >= 5, "only %d kills landed" % fleet.kills)
    check_eq(fleet.own_exits, [], "workers that exited on their own")

    counts = s.check_refund_invariants()
    check_eq(counts.get("UNKNOWN", 0) + counts.get("PROCESSING", 0) + counts.get("PENDING", 0),
             0, "refunds left open")
    rows = dict((r[0], (r[1], r[2])) for r in s.query(
        "SELECT id, status, coalesce(reason, '') FROM refund_attempts"))
    wrong = []
    for rid, kind in kinds.items():
        st, why = rows[rid]
        want = {"over": ("REJECTED", "exceeds_charge"),
                "second_over": ("REJECTED", "exceeds_charge"),
                "not_refundable": ("REJECTED", "not_refundable")}.get(kind)
        if want and (st != want[0] or not why.startswith(want[1])):
            wrong.append((kind, rid, st, why))
        if kind in ("partial", "full", "small") and st not in ("SUCCEEDED", "FAILED",
                                                               "REQUIRES_REVIEW"):
            wrong.append((kind, rid, st, why))
    check_eq(wrong[:5], [], "refunds in the wrong state")
    # The first of a conflicting resend is untouched.
    by_id = {c["refund_id"]: c for c in refunds}
    amounts = dict((r[0], int(r[1])) for r in s.query("SELECT id, amount FROM refund_attempts"))
    for c in conflicts:
        check_eq(amounts[c["refund_id"]], by_id[c["refund_id"]]["amount"],
                 "amount of refund %s after its conflicting resend" % c["refund_id"])
    # Every dead letter has its reason; each conflicting resend exactly one.
    letters = {}
    for d in s.dead_letters():
        h = dict((x[0], x[1]) for x in d["headers"])
        check(h.get("dlq.reason") and h.get("dlq.error"), "a dead letter without its reason: %s"
              % h)
        letters.setdefault(h["dlq.id"], (h, json.loads(d["value"])))
    conflict_ids = {(c["refund_id"], c["amount"]) for c in conflicts}
    got = [(v.get("refund_id"), v.get("amount")) for h, v in letters.values()
           if h["dlq.reason"] == "idempotency_key_conflict"]
    check_eq(sorted(got), sorted(conflict_ids), "conflicting resends dead-lettered, each once")
    check_eq([h["dlq.reason"] for h, v in letters.values()
              if h["dlq.reason"] != "idempotency_key_conflict"], [], "other dead letters")
    s.check_invariants()
    s.check_audited()
    e2e.log("refunds by state:", counts, "provider refunds",
            len(s.psp_get("/ledger")["refunds"]))


if __name__ == "__main__":
    raise SystemExit(e2e.main(scenario))
