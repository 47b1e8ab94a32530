#!/usr/bin/env python3
"""Adversary 38f, break: the reconciler's 429s are never counted in
charged_provider_throttled_total, so the throttling alert cannot fire for
it. Issue 38: "Metrics: ... charged_provider_throttled_total by class" and
"An alert fires on sustained throttling"; deploy/prometheus's
ChargedProviderThrottled divides that counter by
charged_provider_responses_total per (role, instance).

Only the worker's engine adds to the counter (engine_provider.c);
reconciler_look.c counts every answer in charged_provider_responses_total
(outcome not_executed for a 429) and never a throttled one. (The auditor's
walks, common/audit, count neither.)

Twenty charges left UNKNOWN (psp-sim executes them and answers 500);
psp-sim then throttles the classes of the reconciler's looks at 1/s
(burst 1) and the reconciler looks; the worker sends nothing more. psp-sim
answers the reconciler 429 five times and more (its own count), and the
reconciler's /metrics must show at least one throttled request; it shows
none."""
import charged_e2e as e2e
from charged_e2e import check

N = 20
ENV = {"WORKER_UNKNOWN_RETRIES": "0", "RECONCILER_FIRST_LOOK_MS": "0",
       "RECONCILER_POLL_MS": "200"}
LOOKS = ("create", "retrieve", "search", "list")


def unknown(s):
    return int(s.query("SELECT count(*) FROM payment_attempts WHERE status = 'UNKNOWN'")[0][0])


def scenario(new):
    s = new("adv38f_rec429", partitions=4, worker_env=ENV,
            psp_args=["--fault", "error_after=1"])
    w = s.start_worker()
    s.wait_group_settled([w])
    s.publish([e2e.new_command(amount=100 + i) for i in range(N)])
    e2e.wait_until("%d attempts UNKNOWN" % N, lambda: unknown(s) == N, e2e.scaled(30), 0.2)
    s.psp_put("/faults", {}, method="DELETE")
    # The classes of the reconciler's looks (its charge sent again with the
    # attempt's key: create; retrieve, search, list); the worker sends
    # nothing more, every charge of it being settled UNKNOWN.
    s.psp_put("/rate-limits", {"global": 0, "retry_after": True,
                               "classes": {c: {"rate": 1, "burst": 1} for c in LOOKS}})
    r = s.start_reconciler()

    def psp_throttled():
        t = s.psp_get("/rate-limits")["throttled"]
        return sum(t.get(c, 0) for c in LOOKS)
    e2e.wait_until("psp-sim answered the reconciler's looks 429 five times",
                   lambda: psp_throttled() >= 5, e2e.scaled(30), 0.2)
    sent_429 = psp_throttled()

    def counted():
        m = s.admin_metrics(r)
        return sum(v for k, v in m.items()
                   if k.startswith("charged_provider_throttled_total"))
    try:
        e2e.wait_until("the reconciler counts its 429s", lambda: counted() > 0,
                       e2e.scaled(5), 0.2)
    except e2e.Failure:
        pass
    m = s.admin_metrics(r)
    shown = {k: v for k, v in m.items()
             if k.startswith("charged_provider_throttled_total")
             or k.startswith("charged_provider_responses_total")}
    e2e.log("psp-sim throttled:", s.psp_get("/rate-limits")["throttled"],
            "reconciler /metrics:", shown)
    check(counted() > 0,
          "psp-sim answered the reconciler's look-ups 429 %d times, "
          "and the reconciler's charged_provider_throttled_total shows none (%s): the "
          "ChargedProviderThrottled alert cannot fire for it" % (sent_429, shown))


if __name__ == "__main__":
    raise SystemExit(e2e.main(scenario))
