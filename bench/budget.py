#!/usr/bin/env python3
"""The provider budget's benchmark (issue 38, "Goals"), ratios from one run:
three workers, a reconciler and an auditor against psp-sim's limiter, the
fleet's budget set to the same limits (`chargectl provider limits set`).

  steady    100 req/s global, 25/s per endpoint class, --charges N queued:
            create requests/s over the run against the binding limit
            (create's 25/s: charges are POST /v1/payment_intents alone, and
            the auditor's and reconciler's reads are other classes, far from
            100/s together), the share answered 429, the breaker openings
  change    global 100 -> 40 -> 100 at run time (create 100, so the global
            limit binds): seconds until the fleet follows, each way
  priority  global 40, create 30: charges alone, then with the reconciler's
            backlog at 1,000 UNKNOWN attempts; charges' rate with the backlog
            against their rate without
  kill      steady's limits; one worker SIGKILLed: the create requests lost
            after the kill, against one lease's worth of its share

Every number comes from psp-sim: its ledger (the time of each charge it
made: creates per second) and GET /rate-limits (requests served and 429s
per second); breaker openings from the workers' metrics. The per-second
series are printed and drawn in a PNG (--chart). docs/performance.md ("The
provider budget") says what each ratio means and gives measured numbers.
Goals print MET/MISSED: a measure from one run, not a pass/fail test.

Needs the test stack: CHARGED_TEST_DATABASE_URL, CHARGED_TEST_KAFKA,
CHARGED_BUILD_DIR (see bench/worker_throughput.py).

  python3 bench/budget.py [--charges N] [--parts steady,change,priority,kill]
                          [--no-budget] [--phase-s S] [--out PATH] [--chart PATH]
"""
import argparse
import json
import math
import os
import signal
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "tests", "e2e"))
sys.path.insert(0, HERE)
import charged_e2e as e2e  # noqa: E402
import png_chart  # noqa: E402

PARTS = ("steady", "change", "priority", "kill")
CLASSES = ("create", "capture", "refund", "retrieve", "search", "list")
LEASE_S = 1.0  # BUDGET_LEASE_MS (common/budget): what a dead member may hold
PARTITIONS = 12  # of the command topic (the harness's default)
BACKLOG = 1000  # UNKNOWN attempts in the reconciler's backlog (priority)
AUDITOR = {"AUDITOR_WINDOW_MS": 2000, "AUDITOR_LAG_MS": 1500, "AUDITOR_POLL_MS": 200}
log = e2e.log


class Limits:
    """One set of limits, as psp-sim's flags, its PUT /rate-limits body and
    chargectl's arguments: requests/s, global and per class (0: none)."""

    def __init__(self, global_rps, **classes):
        self.global_rps = global_rps
        self.classes = {c: classes.get(c, 25) for c in CLASSES}

    def psp_args(self):
        args = ["--rate-limit", str(self.global_rps)]
        for c, n in self.classes.items():
            args += ["--rate-limit-class", "%s=%d" % (c, n)]
        return args

    def psp_body(self):
        return {"global": self.global_rps, "classes": dict(self.classes)}

    def ctl_args(self):
        args = ["--global", str(self.global_rps)]
        for c, n in self.classes.items():
            args += ["--class", "%s=%d" % (c, n)]
        return args

    def text(self):
        return "global %d/s, %s" % (self.global_rps, ", ".join(
            "%s %d/s" % (c, n) for c, n in self.classes.items()))


STEADY = Limits(100)
CHANGE_HIGH, CHANGE_LOW = Limits(100, create=100), Limits(40, create=100)
PRIORITY = Limits(40, create=30)


class Bench:
    def __init__(self, new, args):
        self.new, self.args = new, args
        self.goals = []  # (goal, ratio, met, how it is read)
        self.series = []  # (panel title, [(label, served, throttled, colour)])
        self.numbers = {}

    def goal(self, name, ratio, met, how):
        self.goals.append((name, ratio, met, how))
        log("goal %-40s %s  %s" % (name, fmt(ratio), "MET" if met else "MISSED"))

    def scenario(self, label, limits, psp_extra=()):
        s = self.new("budget_" + label, psp_args=limits.psp_args() + list(psp_extra))
        self.set_limits(s, limits, psp=False)
        return s

    def set_limits(self, s, limits, psp=True):
        """The provider's limits (psp-sim, at once) and the fleet's budget to
        the same (unless --no-budget)."""
        if psp:
            s.psp_put("/rate-limits", limits.psp_body())
        if not self.args.no_budget:
            s.run([e2e.CHARGECTL, "provider", "limits", "set"] + limits.ctl_args(),
                  extra_env={"CHARGED_ACTOR": "bench"})

    def fleet(self, s, workers=3, **env):
        """Three workers, each holding partitions of the command topic, a
        reconciler and an auditor; the workers' names."""
        names = [s.start_worker(**env) for _ in range(workers)]
        s.start_reconciler(RECONCILER_FIRST_LOOK_MS=0)
        s.start_auditor(AUDITOR_FROM=int(time.time()) - 2, **AUDITOR)
        e2e.wait_until("every worker holding partitions, all %d held" % PARTITIONS,
                       lambda: spread(s, names), 60, 0.5)
        return names


def spread(s, names):
    have = [held(s, n) for n in names]
    return all(have) and len(set().union(*have)) == PARTITIONS


def held(s, name):
    """The partitions worker `name` holds now, from its log (a cooperative
    group adds and takes partitions a few at a time)."""
    have = set()
    for line in s.worker_log(name, "partitions "):
        parts = set(p for p in line.get("partitions", "").split(",") if p)
        if line["msg"] == "partitions assigned":
            have |= parts
        else:  # revoked or lost
            have -= parts
    return have


def fmt(x):
    if x is None:
        return "n/a"
    if isinstance(x, float) and math.isinf(x):
        return "never"
    return "%.3f" % x


# ---- what psp-sim saw ----

def per_second(s, t0, t1):
    """psp-sim's series between unix seconds t0 and t1 (both included):
    {second: (served, throttled)}, a second without a request as (0, 0)."""
    got = {p["at"]: (p["served"], p["throttled"])
           for p in s.psp_get("/rate-limits")["per_second"]}
    return {t: got.get(t, (0, 0)) for t in range(int(t0), int(t1) + 1)}


def creates(s, since):
    """Unix ms of each charge psp-sim made since `since` (unix s), sorted."""
    return sorted(c["at_ms"] for c in s.psp_get("/ledger")["charges"]
                  if c["at_ms"] >= since * 1000 and not c.get("injected"))


def creates_per_second(at_ms, t0, t1):
    out = {t: 0 for t in range(int(t0), int(t1) + 1)}
    for ms in at_ms:
        if int(ms // 1000) in out:
            out[int(ms // 1000)] += 1
    return out


def charge_rate(at_ms):
    """Charges/s from the first charge to the last: n - 1 intervals."""
    if len(at_ms) < 2:
        return 0.0
    return (len(at_ms) - 1) / ((at_ms[-1] - at_ms[0]) / 1000.0)


def breaker_opens(s, names):
    total = 0
    for n in names:
        m = s.admin_metrics(n)
        total += sum(v for k, v in m.items() if k.startswith("charged_provider_breaker_opens_total"))
    return int(total)


def warm(s, rate):
    """Until the fleet made 0.9 x rate charges/s over the last 2 s, or 20 s
    passed (a fleet that never gets there is measured as it is)."""
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline and len(creates(s, time.time() - 2)) < 1.8 * rate:
        time.sleep(0.5)


def wait_creates(s, since, n, timeout):
    e2e.wait_until("%d charges at psp-sim" % n, lambda: len(creates(s, since)) >= n, timeout, 0.5)


def print_series(title, rows):
    print("%s (second, served, 429, limit)" % title)
    for label, served, throttled, _ in rows:
        print("  %-14s %5d %5d" % (label, served, throttled))


def series_rows(sec, t_mark, limit_at, max_rows=60):
    """Rows for the chart and the print: one per second, or per group of
    seconds (their mean) when there are more than max_rows."""
    keys = sorted(sec)
    step = max(1, math.ceil(len(keys) / max_rows))
    rows = []
    for i in range(0, len(keys), step):
        group = keys[i:i + step]
        served = sum(sec[t][0] for t in group) / len(group)
        throttled = sum(sec[t][1] for t in group) / len(group)
        limit = limit_at(group[0])
        label = "T%+d L%d" % (group[0] - t_mark, limit)
        rows.append((label, round(served), round(throttled), limit))
    return rows


# ---- the parts ----

def steady(b):
    """Goal 1: the fleet against 100/s global and 25/s per class."""
    n = b.args.charges
    s = b.scenario("steady", STEADY)
    s.publish([e2e.new_command() for _ in range(n)])
    t0 = time.time()
    workers = b.fleet(s)
    wait_creates(s, t0, n, timeout=60 + 4 * n / STEADY.classes["create"])
    at = creates(s, t0)
    first, last = at[0] / 1000.0, at[-1] / 1000.0
    sec = per_second(s, first, last)
    served = sum(v[0] for v in sec.values())
    throttled = sum(v[1] for v in sec.values())
    opens = breaker_opens(s, workers)
    rate = charge_rate(at)
    binding = STEADY.classes["create"]
    b.numbers["steady"] = {"charges": n, "seconds": last - first, "create_rps": rate,
                           "served": served, "throttled": throttled, "breaker_opens": opens}
    print("steady: %d charges in %.1f s: %.2f creates/s against create's %d/s; psp-sim "
          "served %d requests (%.1f/s, every class), answered %d with 429; breaker opened %d "
          "times" % (n, last - first, rate, binding, served, served / max(1, len(sec)),
                     throttled, opens))
    b.goal("requests / binding limit (create 25/s)", rate / binding, rate >= 0.95 * binding,
           "creates/s from psp-sim's ledger, first charge to last, / 25")
    share = throttled / max(1, served + throttled)
    b.goal("share of requests answered 429", share, share <= 0.001,
           "429s / requests over the run, psp-sim's series; goal <= 0.001")
    b.goal("breaker openings", float(opens), opens == 0,
           "charged_provider_breaker_opens_total over the 3 workers; goal 0")
    rows = series_rows(sec, int(first), lambda t: binding)
    b.series.append(("STEADY: REQUESTS/S SERVED (ALL CLASSES), CREATE LIMIT 25", rows))


def change(b):
    """Goal 2: the limit 100 -> 40 -> 100 at run time, followed within 2 s."""
    p = b.args.phase_s
    n = 100 * (3 * p + 30)  # never runs out: up to 20 s to warm up, 100/s at most
    s = b.scenario("change", CHANGE_HIGH)
    s.publish([e2e.new_command() for _ in range(n)])
    t0 = time.time()
    b.fleet(s)
    warm(s, CHANGE_HIGH.global_rps)
    time.sleep(p)
    t_down = time.time()
    b.set_limits(s, CHANGE_LOW)
    time.sleep(p)
    t_up = time.time()
    b.set_limits(s, CHANGE_HIGH)
    time.sleep(p)
    t_end = time.time()
    sec = per_second(s, t_down - p, t_end)
    down = follow(sec, t_down, t_up, lambda sv, th: sv + th <= 1.05 * CHANGE_LOW.global_rps,
                  sustained=True)
    up = follow(sec, t_up, t_end, lambda sv, th: sv >= 0.95 * CHANGE_HIGH.global_rps)
    b.numbers["change"] = {"phase_s": p, "down_s": down, "up_s": up, "charges_queued": n,
                           "started": t0}
    print("change: global 100 -> 40 at T, back to 100 at T+%d s: followed down in %s s, "
          "up in %s s" % (p, fmt(down), fmt(up)))
    b.goal("seconds to follow 100 -> 40", down, down <= 2,
           "from the change to the end of the first second from which requests sent "
           "(served + 429) stay <= 42/s; goal <= 2")
    b.goal("seconds to follow 40 -> 100", up, up <= 2,
           "from the change to the end of the first second served >= 95/s; goal <= 2")

    def limit_at(t):
        return CHANGE_LOW.global_rps if t_down <= t + 0.5 < t_up else CHANGE_HIGH.global_rps
    rows = series_rows(sec, int(t_down), limit_at)
    b.series.append(("CHANGE: SERVED/S, GLOBAL 100 -> 40 AT T+0 -> 100 AT T+%d" % p, rows))


def follow(sec, t_change, t_next, ok, sustained=False):
    """Seconds from t_change to the end of the first whole second s (from
    the one the change falls in) such that ok(served, throttled) holds at s
    (and, if sustained, at every second after s before t_next's)."""
    seconds = [t for t in sorted(sec) if int(t_change) <= t < int(t_next)]
    for i, t in enumerate(seconds):
        rest = seconds[i:] if sustained else [t]
        if all(ok(*sec[u]) for u in rest):
            return max(0.0, t + 1 - t_change)
    return float("inf")


def backlog(s, b):
    """BACKLOG attempts left UNKNOWN as a lost answer leaves them: psp-sim
    unlimited and dropping every answer after executing, one worker that
    does not retry (WORKER_UNKNOWN_RETRIES=0) and whose breaker stays closed
    (an open one holds the attempts for a retry); then the limits and no
    fault."""
    s.psp_put("/rate-limits", {})
    s.psp_put("/faults", {"rules": [{"kind": "drop_after", "probability": 1}]})
    s.publish([e2e.new_command() for _ in range(BACKLOG)])
    w = s.start_worker(WORKER_UNKNOWN_RETRIES=0, PROVIDER_BREAKER_FAILURE_RATE=0,
                       RECONCILER_FIRST_LOOK_MS=0)  # due at once
    e2e.wait_until("%d attempts UNKNOWN" % BACKLOG, lambda: unknown(s) >= BACKLOG, 120, 0.5)
    s.kill_worker(w, signal.SIGTERM)
    s.psp_put("/faults", {}, method="DELETE")
    b.set_limits(s, PRIORITY)


def unknown(s):
    return int(s.query("SELECT count(*) FROM payment_attempts WHERE status = 'UNKNOWN'")[0][0])


def priority_run(b, label, with_backlog):
    n = min(b.args.charges, 750)
    s = b.scenario(label, PRIORITY)
    if with_backlog:
        backlog(s, b)
    left_before = unknown(s)
    s.publish([e2e.new_command() for _ in range(n)])
    t0 = time.time()
    b.fleet(s)
    wait_creates(s, t0, n, timeout=60 + 4 * n / PRIORITY.classes["create"])
    at = creates(s, t0)
    sec = per_second(s, at[0] / 1000.0, at[-1] / 1000.0)
    return {"charges": n, "create_rps": charge_rate(at), "unknown_before": left_before,
            "unknown_after": unknown(s), "served": sum(v[0] for v in sec.values()),
            "throttled": sum(v[1] for v in sec.values()), "seconds": (at[-1] - at[0]) / 1000.0}


def priority(b):
    """Goal 3: charges keep >= 0.8x their share with a backlog of lookups."""
    alone = priority_run(b, "prio_alone", False)
    busy = priority_run(b, "prio_backlog", True)
    ratio = busy["create_rps"] / alone["create_rps"] if alone["create_rps"] else 0.0
    b.numbers["priority"] = {"alone": alone, "backlog": busy}
    for what, r in (("alone", alone), ("with backlog", busy)):
        print("priority, %s: %d charges at %.2f/s; psp-sim served %d, 429 %d in %.1f s; "
              "UNKNOWN %d -> %d" % (what, r["charges"], r["create_rps"], r["served"],
                                    r["throttled"], r["seconds"], r["unknown_before"],
                                    r["unknown_after"]))
    b.goal("charges with backlog / charges alone", ratio, ratio >= 0.8,
           "creates/s with 1,000 UNKNOWN attempts being looked up / without, under global "
           "40/s, create 30/s; goal >= 0.8")


def kill(b):
    """Goal 4: a worker SIGKILLed costs at most one lease's worth."""
    p = b.args.phase_s
    binding = STEADY.classes["create"]
    n = binding * (2 * p + 30)  # never runs out: up to 20 s to warm up
    s = b.scenario("kill", STEADY)
    s.publish([e2e.new_command() for _ in range(n)])
    # A long session: the group rebalances after the window measured, so
    # what is lost is the budget's, not Kafka's.
    t0 = time.time()
    workers = b.fleet(s, KAFKA_SESSION_TIMEOUT_MS=45000)
    warm(s, binding)
    time.sleep(p)
    share = member_share(s, s.workers[workers[0]].pid, binding / 3.0)
    t_kill = time.time()
    s.kill_worker(workers[0])
    time.sleep(p)
    t_end = time.time()
    per = creates_per_second(creates(s, t0), t_kill - p, t_end)
    sec = per_second(s, t_kill - p, t_end)
    before = [binding - per[t] for t in per if t < int(t_kill)]
    mean_short = sum(before) / max(1, len(before))
    seconds = sorted(t for t in per if int(t_kill) <= t < int(t_end))
    # The kill's own loss: from its second until the fleet is back, two
    # seconds in a row at its rate before; the seconds after are the
    # fleet's ordinary ripple (+-1 a second), which a longer sum adds up.
    back = next((i for i in range(len(seconds) - 1)
                 if all(binding - per[seconds[j]] <= mean_short for j in (i, i + 1))),
                len(seconds))
    lost = sum(binding - per[t] for t in seconds[:back]) - back * mean_short
    lost_all = sum(binding - per[t] for t in seconds) - len(seconds) * mean_short
    worth = share * LEASE_S
    b.numbers["kill"] = {"share_rps": share, "lost": lost, "lost_whole_phase": lost_all,
                         "recovered_after_s": back, "lease_worth": worth,
                         "per_second": per, "t_kill": t_kill}
    print("kill: worker %s (share %.2f/s) SIGKILLed; back at the rate before after %d s; "
          "creates lost until then, beyond the shortfall before: %.1f (over the whole %d s "
          "after: %.1f; one lease's worth: %.1f)"
          % (workers[0], share, back, lost, len(seconds), lost_all, worth))
    b.goal("creates lost / one lease's worth", lost / worth, lost <= worth,
           "(25 - creates/s) summed from the kill until two seconds in a row at the rate "
           "before, less the mean shortfall before, / (its share x lease 1 s); goal <= 1")
    sec = {t: (per[t], sec[t][1]) for t in per}
    b.series.append(("KILL: CREATES/S (429S: EVERY CLASS), A WORKER SIGKILLED AT T+0",
                     series_rows(sec, int(t_kill), lambda t: binding)))


def member_share(s, pid, default):
    """The create share (req/s) the member with pid holds, from chargectl
    provider limits show --json; default when it is no member (no budget)."""
    out = json.loads(s.run([e2e.CHARGECTL, "provider", "limits", "show", "--json"]).stdout)
    for m in out.get("members", []):
        if m.get("pid") == pid:
            return m["held_mrps"][1 + CLASSES.index("create")] / 1000.0
    return default


def chart(b, path):
    panels = []
    for title, rows in b.series:
        top = 1.15 * max([r[3] for r in rows] + [r[1] for r in rows] + [1])
        panels.append(png_chart.Panel(title, [
            (label, served, "%d / 429 %d" % (served, throttled), 0 if throttled == 0 else 1)
            for label, served, throttled, _ in rows], max_value=top))
    if panels:
        png_chart.write(path, panels, title="PROVIDER BUDGET (%s)" % (
            "NO BUDGET" if b.args.no_budget else "BUDGET ON"),
            footer="L: LIMIT IN FORCE. ORANGE: A SECOND WITH 429S")


def parse(argv):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--charges", type=int, default=10000,
                    help="charges queued for steady (priority: at most 750)")
    ap.add_argument("--parts", default=",".join(PARTS), help="which parts, comma-separated")
    ap.add_argument("--no-budget", action="store_true",
                    help="leave the fleet's budget unset: psp-sim's limiter alone")
    ap.add_argument("--phase-s", type=int, default=10, help="seconds per phase (change, kill)")
    ap.add_argument("--out", default=os.path.join(e2e.BUILD, "bench-budget.json"))
    ap.add_argument("--chart", default=None, help="PNG path (default: --out's, .png)")
    args = ap.parse_args(argv)
    parts = [p for p in args.parts.split(",") if p]
    bad = [p for p in parts if p not in PARTS]
    if bad:
        ap.error("no such part: %s (have %s)" % (",".join(bad), ",".join(PARTS)))
    args.parts = parts
    return args


def main(new):
    args = parse(sys.argv[1:])
    b = Bench(new, args)
    print("provider budget bench: %s; fleet budget %s" % (
        ", ".join(args.parts), "unset (--no-budget)" if args.no_budget else "set to the limits"))
    for part in args.parts:
        globals()[part](b)
    for title, rows in b.series:
        print_series(title, rows)
    print("goals:")
    for name, ratio, met, how in b.goals:
        print("  %-40s %8s  %-6s  %s" % (name, fmt(ratio), "MET" if met else "MISSED", how))
    with open(args.out, "w") as f:
        json.dump({"args": vars(args), "numbers": b.numbers, "series": b.series,
                   "goals": b.goals}, f, indent=1, default=str)
    path = args.chart or os.path.splitext(args.out)[0] + ".png"
    chart(b, path)
    print("JSON: %s, chart: %s" % (args.out, path))


if __name__ == "__main__":
    sys.exit(e2e.main(main))
