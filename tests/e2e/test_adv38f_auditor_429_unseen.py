#!/usr/bin/env python3
"""Adversary 38f, break: the scheduled auditor's 429s are counted nowhere
in its /metrics: neither charged_provider_throttled_total nor even
charged_provider_responses_total (common/audit calls the provider and adds
to neither), so ChargedProviderThrottled (throttled / responses per role
and instance) cannot fire for it, however long its walks are throttled.
Issue 38: "Metrics: ... charged_provider_throttled_total by class" and "An
alert fires on sustained throttling".

Forty charges settled; psp-sim then throttles the classes of the auditor's
walks (list, retrieve) at 2/s (burst 1, Retry-After) and the auditor walks
from before the charges: psp-sim answers it 429 (its own count, from
classes only the auditor sends), and the auditor's /metrics must show at
least one throttled request; it shows none."""
import time

import charged_e2e as e2e
from charged_e2e import check

AUDITOR = {"AUDITOR_WINDOW_MS": 2000, "AUDITOR_LAG_MS": 1500, "AUDITOR_POLL_MS": 200}
WALKS = ("list", "retrieve")


def scenario(new):
    s = new("adv38f_aud429", partitions=4)
    t0 = int(float(s.query("SELECT extract(epoch FROM now())")[0][0])) - 2
    w = s.start_worker()
    s.wait_group_settled([w])
    s.publish([e2e.new_command(amount=100 + i) for i in range(40)])
    s.wait_settled(40, e2e.scaled(30))
    s.psp_put("/rate-limits", {"classes": {c: {"rate": 2, "burst": 1} for c in WALKS},
                               "retry_after": True})
    a = s.start_auditor(AUDITOR_FROM=t0, **AUDITOR)

    def psp_throttled():
        t = s.psp_get("/rate-limits")["throttled"]
        return sum(t.get(c, 0) for c in WALKS)
    e2e.wait_until("psp-sim answered the auditor 429 five times",
                   lambda: psp_throttled() >= 5, e2e.scaled(30), 0.2)
    sent_429 = psp_throttled()

    def provider_series():
        return {k: v for k, v in s.admin_metrics(a).items()
                if k.startswith("charged_provider_throttled_total")
                or k.startswith("charged_provider_responses_total")}

    def counted():
        return sum(v for k, v in provider_series().items()
                   if k.startswith("charged_provider_throttled_total"))
    try:
        e2e.wait_until("the auditor counts its 429s", lambda: counted() > 0,
                       e2e.scaled(5), 0.2)
    except e2e.Failure:
        pass
    shown = provider_series()
    e2e.log("psp-sim throttled:", s.psp_get("/rate-limits")["throttled"],
            "auditor /metrics (provider series):", shown)
    check(counted() > 0,
          "psp-sim answered the auditor's walks 429 %d times (list, retrieve), and the "
          "auditor's /metrics count none (provider series: %s): the "
          "ChargedProviderThrottled alert cannot fire for it" % (sent_429, shown))


if __name__ == "__main__":
    raise SystemExit(e2e.main(scenario))
