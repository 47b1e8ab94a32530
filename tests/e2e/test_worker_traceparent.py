#!/usr/bin/env python3
"""Every worker log line about an attempt names its attempt and order, and
carries the W3C traceparent of the command's Kafka headers when it has one
valid one: a charged command's lines and a dead letter's. A traceparent
that is not valid (upper case, a byte too many, control and quote bytes,
invalid UTF-8, two of them) is left out whole: none of its bytes reaches
the log."""
import json
import os

import charged_e2e as e2e
from charged_e2e import check, check_eq


def tp(n):
    """A valid traceparent, different for each n."""
    return "00-%032x-%016x-01" % (0x4bf92f3577b34da6a3ce929d0e0e4700 + n, 0xf067aa0ba902b700 + n)


def record(cmd, headers):
    return {"key": cmd["payment_attempt_id"], "value": json.dumps(cmd), "headers": headers}


def scenario(new):
    s = new("traceparent", partitions=3)
    good = [e2e.new_command() for _ in range(3)]
    upper, long_, raw, twice, plain = [e2e.new_command() for _ in range(5)]
    # Bytes that would break a JSON line or a terminal, after a valid prefix.
    raw_bytes = tp(9)[:40].encode() + b'"\n\x00\xff\x1b[2J' + b"zzzz"
    records = [record(c, [["traceparent", tp(i)]]) for i, c in enumerate(good)]
    records += [
        record(upper, [["traceparent", tp(5).upper()]]),
        record(long_, [["traceparent", tp(6) + "0"]]),
        record(raw, [["traceparent", {"hex": raw_bytes.hex()}]]),
        record(twice, [["traceparent", tp(7)], ["traceparent", tp(8)]]),
        record(plain, []),
        # Not a command at all: its dead letter line carries the trace too.
        {"key": "not-json", "value": "{nope", "headers": [["traceparent", tp(4)]]},
    ]
    s.produce_raw(records)
    w = s.start_worker()
    n = len(good) + 5
    s.wait_settled(n, timeout=120)
    e2e.wait_until("the dead letter's log line",
                   lambda: s.worker_log(w, "command dead-lettered"), 30)

    lines = s.worker_log(w)
    about = {}
    for l in lines:
        if "payment_attempt_id" in l:
            check("order_id" in l, "a line about an attempt without its order: %s" % l)
            about.setdefault(l["payment_attempt_id"], []).append(l)
    for i, c in enumerate(good):
        mine = about.get(c["payment_attempt_id"], [])
        msgs = {l["msg"] for l in mine}
        check({"provider answered", "attempt settled"} <= msgs,
              "lines of attempt %d: %s" % (i, sorted(msgs)))
        for l in mine:
            check_eq(l.get("traceparent"), tp(i), "traceparent of %s" % l)
    for c in (upper, long_, raw, twice, plain):
        mine = about.get(c["payment_attempt_id"], [])
        check(mine, "no lines about attempt %s" % c["payment_attempt_id"])
        for l in mine:
            check("traceparent" not in l, "a traceparent the worker should ignore: %s" % l)
    dead = s.worker_log(w, "command dead-lettered")
    check_eq([l.get("traceparent") for l in dead], [tp(4)], "the dead letter's traceparent")

    with open(os.path.join(s.dir, w + ".log"), "rb") as f:
        text = f.read()
    for bad in (tp(5).upper().encode(), (tp(6) + "0").encode(), raw_bytes[:40] + b'"',
                tp(7).encode(), tp(8).encode()):
        check(bad not in text, "bytes of an ignored traceparent reached the log: %r" % bad)
    s.check_invariants()


if __name__ == "__main__":
    raise SystemExit(e2e.main(scenario))
