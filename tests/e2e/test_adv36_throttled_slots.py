#!/usr/bin/env python3
"""Adversary 36: commands the provider keeps answering 429 hold the worker's
in-flight slots for the key's whole window, and the worker takes no other
command from any partition meanwhile.

charge_policy's table retries PROVIDER_NOT_EXECUTED (409, 429, 401, 403,
404, nothing sent) WHILE_KEY_KEPT: "as often as it takes", with no bound on
the tries, for WORKER_KEY_RETENTION_MS (a day by default) less the margin.
An UNKNOWN answer is bounded (WORKER_UNKNOWN_RETRIES, then settled UNKNOWN
for the reconciler, its slot freed); a 429 for one key or one payment
method is not: the job stays JOB_CALL and keeps its slot. Once
WORKER_MAX_IN_FLIGHT such commands are in flight, engine_start_jobs starts
no other job and every command behind them, on every partition, waits a day
(stripe_classify.c's own words for the default case: "retrying it for as
long as the key is kept would hold the partition for a day").

psp-sim gives the answer on demand: a rate_limit rule for one payment method
with probability 1 and no budget. The test: WORKER_MAX_IN_FLIGHT=4, four
commands with that payment method, then eight ordinary commands (other
payment method, any partition). The ordinary ones should be charged within a
minute; none is even recorded.

While they wait, latency is honest (issue 38): a throttled command is
queued, not failed: `chargectl attempt show` prints its waiting_reason
`provider_throttled` and the status API its `"queued"`, the status the
claim's PROCESSING (docs/states.md, "Waiting")."""
import re
import time

import charged_api
import charged_e2e as e2e
from charged_e2e import check, check_eq

THROTTLED = "pm_card_throttled"
SLOTS = 4


def scenario(new):
    s = new("adv36_throttled_slots", partitions=4)
    s.psp_put("/faults", {"seed": 1, "rules": [
        {"kind": "rate_limit", "probability": 1.0, "payment_method": THROTTLED,
         "times": None}]})
    s.start_worker(WORKER_MAX_IN_FLIGHT=SLOTS)
    throttled = [e2e.new_command(amount=500, payment_method=THROTTLED)
                 for _ in range(SLOTS)]
    s.publish(throttled)
    e2e.wait_until("the throttled commands in flight", lambda: int(s.query(
        "SELECT count(*) FROM payment_attempts WHERE payment_method = '%s'" % THROTTLED
    )[0][0]) == SLOTS, 60)
    time.sleep(3)
    queued_while_throttled(s, throttled[0]["payment_attempt_id"])
    good = [e2e.new_command(amount=700) for _ in range(8)]
    s.publish(good)
    ids = ",".join("'%s'" % g["payment_attempt_id"] for g in good)

    def charged():
        n = int(s.query("SELECT count(*) FROM payment_attempts WHERE id IN (%s)"
                        " AND status = 'SUCCEEDED'" % ids)[0][0])
        return n if n == len(good) else None

    deadline = time.time() + e2e.scaled(60)
    while time.time() < deadline and not charged():
        time.sleep(1)
    got = s.query("SELECT status, count(*) FROM payment_attempts WHERE id IN (%s)"
                  " GROUP BY 1 ORDER BY 1" % ids)
    e2e.log("ordinary commands after a minute:", got, "lag", s.lag()["lag"])
    check_eq(s.exited_workers(), [], "workers that exited")
    check(charged(), "ordinary commands behind %d throttled ones never charged: %s"
          % (SLOTS, got))


def queued_while_throttled(s, attempt_id):
    """The attempt, throttled for 3 s by now, reads queued with its reason
    in chargectl and in the status API (each read between its 429s: a call
    out clears it until its answer parks it again)."""
    _, port = charged_api.start_api(s)

    def shown():
        text = s.run([e2e.CHARGECTL, "attempt", "show", attempt_id]).stdout.decode()
        st, doc = charged_api.get(port, "/v1/payment-attempts/%s" % attempt_id)
        q = doc.get("queued") if st == 200 else None
        if not (re.search(r"^waiting_reason +provider_throttled$", text, re.M) and q
                and q.get("reason") == "provider_throttled"):
            return None
        return text, doc
    text, doc = e2e.wait_until("a throttled attempt shown queued", shown, 10)
    e2e.log("queued:", doc["queued"])
    check_eq(doc["status"], "PROCESSING", "a queued attempt's status")
    check(re.search(r"^waiting_since +\d{4}-\d\d-\d\dT", text, re.M),
          "attempt show prints since when it waits: %s" % text)
    check(doc["queued"]["since"] <= time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime()) + "Z",
          "queued since %s, not in the future" % doc["queued"]["since"])


if __name__ == "__main__":
    raise SystemExit(e2e.main(scenario))
