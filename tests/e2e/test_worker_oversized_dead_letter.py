#!/usr/bin/env python3
"""A dead letter too large to produce must not stop its partition.

A 5 MiB command value, lz4-compressed (the broker takes it: compressed it is
small), cannot go to the DLQ whole: uncompressed it is larger than any
message the worker may produce. A valid command follows it on the same
partition (same key). The worker dead-letters a prefix of the big value with
headers saying it was cut (original size, SHA-256 of the whole) and a dlq.id,
charges the valid command, and commits the partition."""
import hashlib
import json

import charged_e2e as e2e
from charged_e2e import check, check_eq

SIZE = 5 * 1024 * 1024


def big_value(aid):
    # JSON-ish, ASCII, no digit runs (nothing a card-number mask would touch).
    head = '{"type":"charge.requested","payment_attempt_id":"%s","padding":"' % aid
    tail = '"}'
    pad = "oversized-command-padding/"
    n = SIZE - len(head) - len(tail)
    v = head + (pad * (n // len(pad) + 1))[:n] + tail
    check_eq(len(v.encode()), SIZE, "size of the test's big value")
    return v.encode()


def value_bytes(v):
    if isinstance(v, dict):
        return bytes.fromhex(v["hex"])
    return v.encode("utf-8") if v is not None else None


def scenario(new):
    s = new("oversized_dead_letter")
    good = e2e.new_command()
    aid = good["payment_attempt_id"]
    big = big_value(aid)
    s.produce_raw([{"key": aid, "value": big.decode()},
                   {"key": aid, "value": json.dumps(good)}], compression="lz4")
    msgs = [json.loads(l) for l in s.tool("dump", s.topics["commands"]).splitlines() if l]
    check(len(msgs) == 2, "want 2 messages on the commands topic: %s" % (
        [(m["partition"], m["offset"]) for m in msgs]))
    first, second = sorted(msgs, key=lambda m: m["offset"])
    check(first["partition"] == second["partition"] and value_bytes(first["value"]) == big,
          "the big message is not first on one partition")
    part, off = first["partition"], first["offset"]
    e2e.log("big message at partition", part, "offset", off, "; the valid one at", second["offset"])
    del msgs, first, second

    s.start_worker()
    try:
        s.wait_settled(1, timeout=60)
    except e2e.Failure as e:
        status = s.query("SELECT status FROM payment_attempts WHERE id = '%s'" % aid)
        raise e2e.Failure("%s: attempt %s, lag %s, dead letters %d (the partition is stuck "
                          "behind the oversized message)" % (
                              e, status,
                              [p for p in s.lag()["partitions"] if p["partition"] == part],
                              len(s.dead_letters()))) from None
    rows = s.query("SELECT status FROM payment_attempts WHERE id = '%s'" % aid)
    check_eq(rows, [["SUCCEEDED"]], "status of the valid command behind the big one")

    letters = s.dead_letters()
    check(len(letters) == 1, "want one dead letter, got %d" % len(letters))
    d = letters[0]
    h = dict((x[0], x[1]) for x in d["headers"])
    v = value_bytes(d["value"])
    e2e.log("dead letter: value %d bytes, headers %s" % (
        len(v) if v is not None else -1, sorted(h)))
    check_eq(d["key"], aid, "the dead letter's Kafka key")
    check(v is not None and len(v) < len(big) and big.startswith(v),
          "the dead letter's value (%s bytes) is not a shorter prefix of the original" %
          (len(v) if v is not None else None))
    check_eq(h.get("dlq.reason"), "oversized", "dlq.reason")
    check_eq(h.get("dlq.value.truncated"), "true", "dlq.value.truncated")
    check_eq(h.get("dlq.value.original_size"), str(SIZE), "dlq.value.original_size")
    check_eq(h.get("dlq.value.sha256"), hashlib.sha256(big).hexdigest(), "dlq.value.sha256")
    check_eq(h.get("dlq.original.topic"), s.topics["commands"], "dlq.original.topic")
    check_eq(h.get("dlq.original.partition"), str(part), "dlq.original.partition")
    check_eq(h.get("dlq.original.offset"), str(off), "dlq.original.offset")
    want_id = "%s:%d:%d" % (s.topics["commands"], part, off)
    check_eq(h.get("dlq.id"), want_id, "dlq.id")
    lag = s.lag()
    check_eq(lag["lag"], 0, "lag of the group (%s)" % lag)
    s.check_invariants()


if __name__ == "__main__":
    raise SystemExit(e2e.main(scenario))
