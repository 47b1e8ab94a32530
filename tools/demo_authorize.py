"""The demo's shop that ships later: a burst of authorizations, then
captures (some in part), voids, a capture and a void of one authorization,
a second capture, redeliveries, and refunds of captured money (one past
what was captured). Its report puts the provider's totals (psp-sim's
ledger) beside charged's (its tables): authorized, captured, released,
voided, refunded; and counts what must never happen, from the provider's
books: two captures of one authorization, a capture over the hold, a
capture of a voided one, a refund past the capture. The example order
service is that shop too (order_service_holds): it ships and cancels the
orders it authorized, and its report's totals stand beside the provider's
and charged's. Standard library."""
import json
import os
import subprocess
import sys
import time
import urllib.request
import uuid

from demo_common import psql, say

OPEN = "('PENDING', 'PROCESSING', 'UNKNOWN')"


def publish(a, name, commands):
    """One file, one producer: an attempt's commands reach its partition in
    this order."""
    path = os.path.join(a.state, name)
    with open(path, "w") as f:
        f.writelines(json.dumps(c) + "\n" for c in commands)
    subprocess.run([a.chargectl, "publish", "--file", path], check=True,
                   stdout=subprocess.DEVNULL)


def with_copies(rnd, commands):
    """Each command, and a tenth of them twice (a redelivery)."""
    out = []
    for c in commands:
        out.append(c)
        if rnd.random() < 0.10:
            out.append(c)
    return out


def wait_settled(table, ids, deadline, what):
    """Until every record of ids is in table and none is open (the workers'
    and then the reconciler's). False at the deadline."""
    sql = ("SELECT count(*), count(*) FILTER (WHERE status IN %s) FROM %s WHERE id IN ('%s')"
           % (OPEN, table, "','".join(ids)))
    while True:
        total, open_ = (int(x) for x in psql(sql)[0])
        if total == len(ids) and open_ == 0:
            return True
        if time.monotonic() > deadline:
            print("demo: %s not settled (%d of %d recorded, %d open)" %
                  (what, total, len(ids), open_), file=sys.stderr)
            return False
        time.sleep(0.5)


def step(kind, attempt, **fields):
    sid = str(uuid.uuid4())
    c = {"type": kind + ".requested", "version": 1, kind + "_id": sid,
         "payment_attempt_id": attempt, "idempotency_key": "%s:%s" % (kind, sid)}
    c.update(fields)
    return c


def plan_steps(rnd, authorized):
    """What the shop does with each hold: ships all (capture), ships part of
    it (an item missing), cancels (void), captures and cancels at once, or
    captures twice; a few are left held."""
    steps = []
    for i, (attempt, amount) in enumerate(authorized):
        roll = rnd.random()
        if roll < 0.45:
            steps.append(step("capture", attempt))
        elif roll < 0.65:
            steps.append(step("capture", attempt, amount=max(1, amount * 2 // 3)))
        elif roll < 0.85:
            steps.append(step("void", attempt, reason="requested_by_customer"))
        elif roll < 0.90:
            steps += [step("capture", attempt), step("void", attempt, reason="abandoned")]
        elif roll < 0.95:
            steps += [step("capture", attempt, amount=max(1, amount // 2)),
                      step("capture", attempt)]
    return steps


def totals(psp_admin, attempts):
    """The provider's and charged's totals of these attempts, by line."""
    ids = "','".join(attempts)
    led = json.load(urllib.request.urlopen(psp_admin + "/ledger"))
    mine = set(attempts)
    holds = [c for c in led["charges"] if c.get("kind") == "authorization" and
             c.get("payment_attempt_id") in mine and
             c["outcome"] in ("requires_capture", "succeeded", "canceled")]
    intents = {c["payment_intent_id"] for c in holds}
    caps = [c for c in led.get("captures", []) if c["payment_intent_id"] in intents]
    voids = [c for c in led.get("cancels", []) if c.get("kind") == "void" and
             c["payment_intent_id"] in intents]
    lapsed = [c for c in led.get("expiries", []) if c["payment_intent_id"] in intents]
    refunds = [r for r in led.get("refunds", []) if r["payment_intent_id"] in intents and
               r["status"] == "succeeded"]
    provider = {
        "authorized": (len(holds), sum(int(c["amount_authorized"]) for c in holds)),
        "captured": (len(caps), sum(int(c["amount"]) for c in caps)),
        "released": (len(caps) + len(voids) + len(lapsed),
                     sum(int(c.get("amount_released") or 0) for c in caps + voids + lapsed)),
        "voided": (len(voids) + len(lapsed),
                   sum(int(c.get("amount_released") or 0) for c in voids + lapsed)),
        "refunded": (len(refunds), sum(int(r["amount"]) for r in refunds)),
    }
    row = psql(
        "SELECT count(*) FILTER (WHERE status IN ('AUTHORIZED', 'SUCCEEDED', 'VOIDED')),"
        " coalesce(sum(amount) FILTER (WHERE status IN ('AUTHORIZED', 'SUCCEEDED', 'VOIDED')), 0),"
        " count(*) FILTER (WHERE status = 'SUCCEEDED'),"
        " coalesce(sum(captured_amount) FILTER (WHERE status = 'SUCCEEDED'), 0),"
        " count(*) FILTER (WHERE status IN ('SUCCEEDED', 'VOIDED')),"
        " coalesce(sum(amount - coalesce(captured_amount, 0))"
        "   FILTER (WHERE status IN ('SUCCEEDED', 'VOIDED')), 0),"
        " count(*) FILTER (WHERE status = 'VOIDED'),"
        " coalesce(sum(amount) FILTER (WHERE status = 'VOIDED'), 0)"
        " FROM payment_attempts WHERE id IN ('%s')" % ids)[0]
    refunded = psql("SELECT count(*), coalesce(sum(amount), 0) FROM refund_attempts WHERE "
                    "status = 'SUCCEEDED' AND payment_attempt_id IN ('%s')" % ids)[0]
    n = [int(x) for x in row]
    charged = {"authorized": (n[0], n[1]), "captured": (n[2], n[3]), "released": (n[4], n[5]),
               "voided": (n[6], n[7]), "refunded": (int(refunded[0]), int(refunded[1]))}
    # What must never happen, from the provider's books alone.
    per_intent = {}
    for c in caps:
        per_intent[c["payment_intent_id"]] = per_intent.get(c["payment_intent_id"], 0) + 1
    held = {c["payment_intent_id"]: int(c["amount_authorized"]) for c in holds}
    took = {c["payment_intent_id"]: int(c["amount"]) for c in caps}
    voided = {c["payment_intent_id"] for c in voids}
    back = {}
    for r in refunds:
        back[r["payment_intent_id"]] = back.get(r["payment_intent_id"], 0) + int(r["amount"])
    never = {
        "two captures of one hold": sum(1 for v in per_intent.values() if v > 1),
        "captured over the hold": sum(1 for pi, v in took.items() if v > held.get(pi, 0)),
        "captured after a void": len(voided & set(took)),
        "refunded past the capture": sum(1 for pi, v in back.items() if v > took.get(pi, 0)),
    }
    return provider, charged, never


def authorize_burst(a, rnd, deadline):
    """The burst and its report; the number of violations (a line where the
    provider and charged disagree, or anything of `never`)."""
    cmds = []
    for _ in range(a.authorizations):
        attempt = str(uuid.uuid4())
        cmds.append({"type": "authorization.requested", "version": 1,
                     "payment_attempt_id": attempt, "order_id": str(uuid.uuid4()),
                     "idempotency_key": "authorization:" + attempt,
                     "amount": rnd.randint(100, 50000), "currency": "EUR",
                     "payment_method": "pm_card_chargeDeclined" if rnd.random() < 0.03
                     else "pm_card_visa"})
    attempts = [c["payment_attempt_id"] for c in cmds]
    publish(a, "authorizations.jsonl", with_copies(rnd, cmds))
    if not wait_settled("payment_attempts", attempts, deadline, "authorizations"):
        return 1
    amount = {c["payment_attempt_id"]: c["amount"] for c in cmds}
    authorized = [(r[0], amount[r[0]]) for r in psql(
        "SELECT id FROM payment_attempts WHERE status = 'AUTHORIZED' AND id IN ('%s') "
        "ORDER BY id" % "','".join(attempts))]
    steps = plan_steps(rnd, authorized)
    publish(a, "captures-and-voids.jsonl", with_copies(rnd, steps))
    caps = [s["capture_id"] for s in steps if "capture_id" in s]
    voids = [s["void_id"] for s in steps if "void_id" in s]
    if not (wait_settled("capture_attempts", caps, deadline, "captures") and
            wait_settled("void_attempts", voids, deadline, "voids")):
        return 1
    # Refunds of captured money: a third of the partial captures in full, and
    # a few asked one unit past what was captured (REJECTED exceeds_charge).
    captured = psql("SELECT id, captured_amount FROM payment_attempts WHERE status = "
                    "'SUCCEEDED' AND captured_amount < amount AND id IN ('%s') ORDER BY id"
                    % "','".join(attempts))
    refunds = []
    for i, (attempt, took) in enumerate(captured[: max(1, len(captured) // 3)]):
        rid = str(uuid.uuid4())
        refunds.append({"type": "refund.requested", "version": 1, "refund_id": rid,
                        "payment_attempt_id": attempt, "idempotency_key": "refund:" + rid,
                        "amount": int(took) + (1 if i % 4 == 0 else 0),
                        "reason": "requested_by_customer"})
    if refunds:
        publish(a, "authorization-refunds.jsonl", refunds)
        if not wait_settled("refund_attempts", [r["refund_id"] for r in refunds], deadline,
                            "refunds of captures"):
            return 1
    provider, charged, never = totals(a.psp_admin, attempts)
    by_status = psql("SELECT status, count(*) FROM payment_attempts WHERE id IN ('%s') "
                     "GROUP BY 1 ORDER BY 2 DESC" % "','".join(attempts))
    steps_by = psql("SELECT 'capture ' || status || coalesce(' ' || split_part(reason, ':', 1), "
                    "''), count(*) FROM capture_attempts WHERE id IN ('%s') GROUP BY 1 UNION ALL "
                    "SELECT 'void ' || status || coalesce(' ' || split_part(reason, ':', 1), ''),"
                    " count(*) FROM void_attempts WHERE id IN ('%s') GROUP BY 1 ORDER BY 1"
                    % ("','".join(caps), "','".join(voids)))
    say("authorizations", "%d asked (%d captures, %d voids, %d refunds); %s" % (
        len(cmds), len(caps), len(voids), len(refunds),
        ", ".join("%s %s" % tuple(r) for r in by_status)))
    say("captures and voids", ", ".join("%s %s" % tuple(r) for r in steps_by) or "none")
    bad = 0
    for line in ("authorized", "captured", "released", "voided", "refunded"):
        p, c = provider[line], charged[line]
        bad += p != c
        say(line, "provider %d / %d, charged %d / %d%s" % (
            p[0], p[1], c[0], c[1], "" if p == c else "  <- differ"))
    say("never", ", ".join("%s %d" % kv for kv in never.items()))
    return bad + sum(never.values())


def order_service_holds(a, deadline):
    """The example order service as the same shop: its orders placed with
    --authorize (demo.sh) are shipped (a third with an item missing) and
    canceled here, through its own commands; then its report's totals
    beside the provider's and charged's for its attempts. The number of
    totals that differ."""
    def svc(*args):
        return subprocess.run(a.orders_service.split() + list(args), check=True,
                              capture_output=True).stdout.decode()

    def held():
        """Orders that asked for an authorization, those authorized, and
        their attempts still open: charged not settled, or the service
        without charged's word."""
        return [int(x) for x in psql(
            "SELECT count(DISTINCT o.order_id), count(DISTINCT o.order_id) FILTER (WHERE "
            "o.authorized_attempt_id IS NOT NULL), count(*) FILTER (WHERE a.applied_status IS "
            "NULL OR a.confirm_due) FROM orders o JOIN order_attempts a USING (order_id) WHERE "
            "o.capture_method = 'manual'", a.orders_db)[0]]
    while held()[2] and time.monotonic() < deadline:
        time.sleep(0.5)
    total, authorized, _ = held()
    if not total:
        return 0
    # Three in five shipped, one canceled, one left held (its expiry is days away).
    svc("ship", "--count", str(authorized * 3 // 5), "--missing-item-ratio", "0.33")
    svc("cancel", "--count", str(authorized // 5))
    open_sql = ("SELECT (SELECT count(*) FROM order_captures WHERE confirmed_status IS NULL OR "
                "confirm_due) + (SELECT count(*) FROM order_voids WHERE confirmed_status IS NULL "
                "OR confirm_due) + (SELECT count(*) FROM order_refunds WHERE confirmed_status IS "
                "NULL OR confirm_due) + (SELECT count(*) FROM outbox WHERE sent_at IS NULL)")
    while int(psql(open_sql, a.orders_db)[0][0]):
        if time.monotonic() > deadline:
            print("demo: the order service's captures and voids not settled", file=sys.stderr)
            return 1
        time.sleep(0.5)
    attempts = [r[0] for r in psql("SELECT a.payment_attempt_id FROM order_attempts a JOIN "
                                   "orders o USING (order_id) WHERE o.capture_method = 'manual'",
                                   a.orders_db)]
    # Its refunds of captured orders: settled at charged too.
    wait_settled("refund_attempts", [r[0] for r in psql(
        "SELECT refund_id FROM order_refunds r JOIN orders o USING (order_id) WHERE "
        "o.capture_method = 'manual'", a.orders_db)], deadline, "the order service's refunds")
    provider, charged, never = totals(a.psp_admin, attempts)
    ours = json.loads(svc("report"))["authorizations"]
    steps = psql("SELECT count(*) FILTER (WHERE o.fulfilment = 'shipped'), count(*) FILTER "
                 "(WHERE c.amount < o.amount), count(*) FILTER (WHERE o.fulfilment = 'canceled')"
                 " FROM orders o LEFT JOIN order_captures c USING (order_id) WHERE "
                 "o.authorized_attempt_id IS NOT NULL", a.orders_db)[0]
    lines = ("authorized", "captured", "released", "voided", "refunded")
    differ = [l for l in lines if not ours[l] == provider[l][1] == charged[l][1]]
    say("order service holds", "%d orders, %d authorized, %s shipped (%s in part), %s "
        "canceled" % (total, authorized, steps[0], steps[1], steps[2]))
    say("order service totals", ", ".join("%s %d" % (l, ours[l]) for l in lines) + (
        "; the provider's and charged's the same" if not differ else ""))
    for l in differ:
        say("order service differs", "%s: order service %d, provider %d, charged %d" % (
            l, ours[l], provider[l][1], charged[l][1]))
    say("order service never", ", ".join("%s %d" % kv for kv in never.items()))
    return len(differ) + sum(never.values())
