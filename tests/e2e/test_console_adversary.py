#!/usr/bin/env python3
"""charged console broken on purpose: each scenario proves one place where
the console does not keep a promise of docs/console.md (or a bound it
needs), against the real stack (PostgreSQL, Kafka, psp-sim, a worker).
They fail until the console is fixed. Run one:
    cd build && python3 ../tests/e2e/test_console_adversary.py NAME

Breaks (each scenario's docstring says what it proves):
  pan_as_json_number        a card number as 4242424242424242e0 leaves unmasked
  replay_to_any_topic       a replay writes wherever dlq.original.topic says
  resolve_without_record    a resolution is written while its record cannot be
  refused_resolutions_unrecorded  403 refusals never reach console_actions
  revoked_mid_resolve       a decision written after its token was revoked
  bad_input_no_answer       a split UTF-8 character in an unknown member: no answer
  transactional_letter      one transactional letter breaks every dead-letter list
  big_dlq_memory            every list reads the whole topic into memory
  five_hundred_positions    a 500-letter preview holds a thread for minutes
  slow_clients_lock_out     256 slow connections lock every operator out
  viewer_freezes_console    a viewer's reads, Kafka down, freeze the review queue
  links_blank_the_page      #/attempt/%E0%A4%A, #/__proto__: a blank page
  lookalike_actors          token names with C1 controls, U+2028, bidi, ZWSP
  logout_that_does_not      "signed out", recorded ok, and the session lives on
Guards that hold (kept so that they keep holding):
  replay_races, force_booked_elsewhere, random_letters, db_frozen
"""

import json
import socket
import threading
import time
import uuid

import charged_console as con
import charged_e2e as e2e
from charged_e2e import check, check_eq

CARD = con.CARD


def letter_with(s, value, reason="schema_violation", key=None, extra_headers=()):
    rec = {"key": key or str(uuid.uuid4()), "value": value,
           "headers": [["dlq.reason", reason],
                       ["dlq.error", "adversary"],
                       ["dlq.failed_at", "2026-12-01T10:00:00.000Z"],
                       ["dlq.original.topic", s.topics["commands"]],
                       ["dlq.original.partition", "0"], ["dlq.original.offset", "7"]]
           + [list(h) for h in extra_headers]}
    s.tool("produce", s.topics["dlq"], stdin=(json.dumps(rec) + "\n").encode())
    return rec


def pan_as_json_number(new):
    s = new("console_adv_pan")
    name, port = con.start_console(s)
    op = con.Client(port, con.token(s, "olga", "operator"))
    # The raw bytes hold "4242424242424242e0": the digits touch a letter, so
    # the byte scan takes them for part of a token; the parsed value is a
    # real, which the JSON walk does not look at.
    value = '{"payment_attempt_id": "%s", "card_number": %se0, "exp": 12.2030}' % (
        uuid.uuid4(), CARD)
    letter_with(s, value)
    positions = e2e.wait_until("the letter listed", lambda: [
        p for p, r in con.letter_positions(op) if r == "schema_violation"], 30)
    st, doc, _, raw = con.request(port, "GET", "/console/api/dead-letters/" + positions[0],
                                  headers=op.headers(csrf=False))
    check_eq(st, 200, "GET the letter")
    leaks = []
    if CARD.encode() in raw:
        leaks.append("GET dead-letters/%s: %r" % (positions[0], raw[raw.find(b"card_number"):][:60]))
    st, doc = op.post("dead-letters/replay", {"positions": [positions[0]], "dry_run": True})
    check_eq(st, 200, "the preview")
    if CARD in json.dumps(doc):
        leaks.append("the replay preview")
    st, doc = op.post("dead-letters/replay", {"positions": [positions[0]], "dry_run": False})
    rows = s.query("SELECT detail::text FROM console_actions WHERE action = 'replay'")
    if any(CARD in r[0] for r in rows):
        leaks.append("console_actions.detail")
    # The same through the front door: a command carrying it, sent to the
    # command topic by any producer, is dead-lettered by the worker as it
    # came (its card check is the same byte scan) and shown unmasked.
    s.start_worker()
    cmd = e2e.new_command()
    raw_cmd = json.dumps(cmd)[:-1] + ', "card_number": %se0}' % CARD
    s.produce_raw([{"key": cmd["payment_attempt_id"], "value": raw_cmd}])
    mine = e2e.wait_until("the worker's dead letter of the command", lambda: [
        l for l in con.letter_positions(op) if l[0] not in positions], 60)
    st, doc, _, raw = con.request(port, "GET", "/console/api/dead-letters/" + mine[0][0],
                                  headers=op.headers(csrf=False))
    check_eq(st, 200, "GET the worker's letter")
    if CARD.encode() in raw:
        leaks.append("the worker's letter %s (%s)" % (mine[0][0], mine[0][1]))
    check(not leaks, "the card number %s left the server unmasked in: %s" % (CARD, leaks))


def timed_get(client, path, timeout=15):
    t0 = time.monotonic()
    try:
        st = con.request(client.port, "GET", "/console/api/" + path,
                         headers=client.headers(csrf=False), timeout=timeout)[0]
    except OSError as e:
        st = "no answer (%s)" % e.__class__.__name__
    return st, time.monotonic() - t0


def slow_clients_lock_out(new):
    """No session needed: 300 connections from one other address
    (127.0.0.2) that send a header byte now and then (never finishing their
    request) must not hold every connection the console takes: one address
    holds at most MAX_CONNECTIONS_PER_IP, and a signed-in operator on
    another address is still answered at once. (An attacker behind the
    operator's own address, a shared proxy, is beyond this limit.)"""
    s = new("console_adv_slowloris")
    name, port = con.start_console(s)
    op = con.Client(port, con.token(s, "olga", "operator"))
    check_eq(timed_get(op, "session")[0], 200, "the session before")
    socks, stop = [], threading.Event()
    for _ in range(300):
        try:
            c = socket.create_connection(("127.0.0.1", port), timeout=5,
                                         source_address=("127.0.0.2", 0))
            c.sendall(b"GET /console/api/session HTTP/1.1\r\nHost: x\r\n")
            socks.append(c)
        except OSError:
            break

    def drip():
        while not stop.wait(5):
            for c in socks:
                try:
                    c.sendall(b"X-a: b\r\n")
                except OSError:
                    pass
    threading.Thread(target=drip, daemon=True).start()
    try:
        time.sleep(2)
        results = []
        for _ in range(3):
            results.append(timed_get(op, "session"))
            time.sleep(2)
        e2e.log("operator's GET session while %d slow connections are open: %s" % (len(socks), results))
        check(all(st == 200 and dt < 5 for st, dt in results),
              "an unauthenticated client with %d slow connections locks the operator out: %s"
              % (len(socks), results))
    finally:
        stop.set()
        for c in socks:
            c.close()


def viewer_freezes_console(new):
    """A viewer (read-only) while Kafka is down: each dead-letter read holds
    one of CONSOLE_THREADS listener threads for Kafka's 10 s timeout (and
    every connection that thread polls), so a few such reads in a loop
    freeze the review queue (the database's, which is up) for every
    operator. docs/console.md: "A part that cannot be read says so; the
    rest still shows." """
    s = new("console_adv_kafka_down")
    s.start_worker()
    name, port = con.start_console(s)
    op = con.Client(port, con.token(s, "olga", "operator"))
    # The viewer on a host of its own (its connections are its address's).
    viewer = con.Client(port, con.token(s, "vera", "viewer"), source="127.0.0.3")
    check_eq(timed_get(op, "reviews")[0], 200, "the review queue before")
    e2e.kafka_kill()
    stop = threading.Event()
    try:
        def loop():
            while not stop.is_set():
                try:
                    viewer.get("dead-letters")
                except OSError:
                    pass
        threads = [threading.Thread(target=loop, daemon=True) for _ in range(8)]
        for t in threads:
            t.start()
        time.sleep(1)
        results = [timed_get(op, "reviews") for _ in range(3)]
        e2e.log("operator's GET reviews while a viewer reads dead letters, Kafka down: %s" % results)
        check(all(st == 200 and dt < 3 for st, dt in results),
              "a viewer's dead-letter reads (Kafka down) freeze the review queue: %s" % results)
    finally:
        stop.set()
        e2e.kafka_start()


def replay_races(new):
    """Holds (kept as a guard): two operators replay one letter of a valid
    command at once, then once more; psp-sim's ledger has one charge."""
    s = new("console_adv_replay_race")
    s.start_worker()
    name, port = con.start_console(s)
    a = con.Client(port, con.token(s, "olga", "operator"))
    b = con.Client(port, con.token(s, "omar", "operator"))
    cmd = e2e.new_command()
    con.replayable_letter(s, cmd)
    pos = e2e.wait_until("the letter listed", lambda: [
        p for p, r in con.letter_positions(a) if r == "database_refused"], 30)[0]
    barrier = threading.Barrier(2)
    out = {}

    def go(n, c):
        barrier.wait()
        out[n] = c.post("dead-letters/replay", {"positions": [pos], "dry_run": False})
    ts = [threading.Thread(target=go, args=(n, c)) for n, c in (("a", a), ("b", b))]
    for th in ts:
        th.start()
    for th in ts:
        th.join()
    check_eq(sorted(v[0] for v in out.values()), [200, 200], "two replays at once: %s" % out)
    check_eq(a.post("dead-letters/replay", {"positions": [pos], "dry_run": False})[0], 200,
             "a third replay")
    e2e.wait_until("the attempt settled", lambda: s.query(
        "SELECT status FROM payment_attempts WHERE id = '%s'" % cmd["payment_attempt_id"])
        in ([["SUCCEEDED"]],), 60)
    time.sleep(3)
    charges = [c for c in s.ledger()
               if (c.get("metadata") or {}).get("payment_attempt_id") == cmd["payment_attempt_id"]
               or c.get("idempotency_key") == cmd["idempotency_key"]]
    e2e.log("psp-sim charges of the replayed attempt: %d" % len(charges))
    check(len(charges) <= 1, "replays charged twice: %s" % charges)
    rows = s.query("SELECT actor, outcome FROM console_actions WHERE action = 'replay' ORDER BY id")
    check_eq(sorted(r[1] for r in rows), ["ok", "ok", "ok", "requested", "requested", "requested"],
             "replay records")


def transactional_letter(new):
    """A dead letter written by a transactional (exactly-once) producer, as
    Kafka Connect or Streams write dead letters, committed: the partition's
    last offset is then the commit marker, which no consumer receives. The
    reader waits for it (offset end - 1) for its whole timeout, and every
    dead-letter list and the overview's dead-letter part fail, for every
    letter of every partition, until a plain letter lands after it."""
    s = new("console_adv_txn")
    name, port = con.start_console(s)
    op = con.Client(port, con.token(s, "olga", "operator"))
    letter_with(s, json.dumps({"payment_attempt_id": str(uuid.uuid4())}))
    e2e.wait_until("the plain letter listed", lambda: con.letter_positions(op), 30)
    tool = e2e.KAFKA_TOOL.replace("kafka_test_tool", "txn_produce")
    s.run([tool, s.kafka, s.topics["dlq"], "0",
           json.dumps({"payment_attempt_id": str(uuid.uuid4()), "from": "an exactly-once producer"})])
    # The commit marker reaches the partition when the producer's commit
    # returns, but the console's reader sees the letter only once the last
    # stable offset moves past it: wait for it (the defect never shows it).
    e2e.wait_until("the transactional letter listed beside the plain one",
                   lambda: len((op.get("dead-letters?limit=1000")[1] or {})
                               .get("letters") or []) == 2, 30)
    t0 = time.monotonic()
    st, doc = op.get("dead-letters?limit=1000")
    dt = time.monotonic() - t0
    t0 = time.monotonic()
    st2, ov = op.get("overview")
    dt2 = time.monotonic() - t0
    part = (ov or {}).get("dead_letters")
    e2e.log("dead-letters: %s in %.1fs %s; overview dead_letters in %.1fs: %s" % (st, dt, doc, dt2, part))
    check(st == 200 and len(doc["letters"]) == 2 and dt < 5,
          "two letters, one from a transactional producer: GET dead-letters answered %s in %.1fs: %s"
          % (st, dt, doc))
    check(part and "error" not in part and dt2 < 5,
          "the overview's dead letters after a transactional letter (%.1fs): %s" % (dt2, part))


def resolve_without_record(new):
    """docs/console.md: "Every action is written to console_actions"; a
    replay is refused (503, nothing sent) when its record cannot be
    written. A resolution is not: while console_actions cannot take a row
    (here a session holds a lock on it past the console store's 2 s lock
    timeout), the resolution is written, the operator is told 200, and
    console_actions never hears of it."""
    from test_chargectl_resolve import into_review
    s = new("console_adv_unrecorded", worker_env={"RECONCILER_SEARCH_LAG_MS": "0"})
    s.start_worker()
    name, port = con.start_console(s)
    op = con.Client(port, con.token(s, "olga", "operator"))
    cmd, pi = into_review(s, "pm_card_mastercard")
    con.replayable_letter(s, e2e.new_command())
    pos = e2e.wait_until("the letter listed", lambda: con.letter_positions(op), 30)[0][0]
    holder = e2e.Session(s.db)
    try:
        holder.run("BEGIN")
        holder.run("LOCK TABLE console_actions IN EXCLUSIVE MODE")
        st_replay, doc_replay = op.post("dead-letters/replay", {"positions": [pos], "dry_run": False})
        # Forced: the intent only names the attempt (its own call under
        # its key was refused), so only the operator's word books it.
        st, doc = op.post("attempts/%s/resolve" % cmd["payment_attempt_id"],
                          {"decision": "succeeded", "payment_intent_id": pi["id"],
                           "reason": "paid, seen in the dashboard", "force": True,
                           "confirm": cmd["payment_attempt_id"]})
        holder.run("COMMIT")
    finally:
        holder.close()
    e2e.log("replay while the log is locked: %s %s" % (st_replay, doc_replay))
    check_eq(st_replay, 503, "the replay without its record (held: nothing sent)")
    e2e.log("resolve while the log is locked: %s %s" % (st, doc and doc.get("outcome")))
    settled = s.query("SELECT status FROM payment_attempts WHERE id = '%s'" % cmd["payment_attempt_id"])
    rows = s.query("SELECT actor, outcome FROM console_actions WHERE action = 'resolve'"
                   " AND target = '%s'" % cmd["payment_attempt_id"])
    check(not (settled == [["SUCCEEDED"]] and rows == []),
          "the resolution was written (%s, answered %s) with no row in console_actions: %s"
          % (settled, st, rows))


def lookalike_actors(new):
    """A token's name is the actor of console_actions and of the operator's
    transitions, "1..128 bytes of UTF-8 on one line". Refused: C0 controls.
    Taken: a C1 control (U+0085 NEL, a line break; U+009B, a terminal's
    CSI), U+2028 LINE SEPARATOR, a right-to-left override and a zero-width
    space, so a second live token "olga\u200b" signs in, acts and is
    recorded as an actor no reader tells from "olga"."""
    s = new("console_adv_actor")
    name, port = con.start_console(s)
    con.token(s, "olga", "operator")
    taken = []
    for n in ("olga\u200b", "olga\u0085resolved by olga", "olga\u2028x", "\u202eagl\u202co",
              "o\u009b2Jlga"):
        p = s.run([e2e.CHARGECTL, "console", "token", "add", n, "--role", "operator",
                   "--actor", "e2e-admin", "--json"], check=False)
        if p.returncode == 0:
            taken.append(n)
            if n == "olga\u200b":
                c = con.Client(port, json.loads(p.stdout.decode())["secret"])
                check_eq(c.who["name"], n, "the look-alike's session")
    rows = s.query("SELECT actor FROM console_actions WHERE action = 'login'")
    e2e.log("names taken: %r; login actors: %r" % (taken, rows))
    check(not taken, "token names that look like another actor or break the line, taken: %r" % taken)


def replay_to_any_topic(new):
    """docs/console.md: the console holds "the right to produce to the
    command topic (a replay)". It produces wherever the letter's own
    dlq.original.topic header says: a letter among others, selected with
    "all" and replayed, writes a forged charge result onto the results
    topic (which the order service trusts), under the console's name."""
    s = new("console_adv_any_topic")
    s.start_worker()
    name, port = con.start_console(s)
    op = con.Client(port, con.token(s, "olga", "operator"))
    cmd = e2e.new_command()
    con.replayable_letter(s, cmd)
    forged = {"event_type": "charge.succeeded", "payment_attempt_id": cmd["payment_attempt_id"],
              "order_id": cmd["order_id"], "amount": cmd["amount"], "status": "SUCCEEDED",
              "forged": True}
    rec = {"key": cmd["order_id"], "value": json.dumps(forged),
           "headers": [["dlq.reason", "database_refused"], ["dlq.error", "db down"],
                       ["dlq.failed_at", "2026-12-01T11:00:00.000Z"],
                       ["dlq.original.topic", s.topics["results"]],
                       ["dlq.original.partition", "0"], ["dlq.original.offset", "1"]]}
    s.tool("produce", s.topics["dlq"], stdin=(json.dumps(rec) + "\n").encode())
    positions = e2e.wait_until("both letters listed", lambda: [
        p for p, r in con.letter_positions(op)] if len(con.letter_positions(op)) == 2 else None, 30)
    st, doc = op.post("dead-letters/replay", {"positions": positions, "dry_run": False})
    e2e.log("replay of all: %s %s" % (st, [(l["position"], l.get("sent")) for l in doc.get("letters", [])]))
    results = [json.loads(l["value"]) if isinstance(l.get("value"), str) else l.get("value")
               for l in (json.loads(x) for x in s.tool("dump", s.topics["results"]).splitlines() if x.strip())]
    got = [r for r in results if isinstance(r, dict) and r.get("forged")]
    check(not got, "a replay wrote a forged result onto %s: %s" % (s.topics["results"], got))


def bad_input_no_answer(new):
    """docs/console.md: "Bad input: 400, never a 5xx." A body with an
    unknown member whose name has a multi-byte character across byte 40 is
    refused with "unknown member \"%.40s\"": the cut leaves half a
    character, the error cannot be made JSON, and the console drops the
    connection without any answer. No session needed (sign-in's body)."""
    s = new("console_adv_no_answer")
    name, port = con.start_console(s)
    op = con.Client(port, con.token(s, "olga", "operator"))
    body = json.dumps({"a" * 39 + "\u00e9": 1}, ensure_ascii=False).encode()
    got = {}
    for who, path in (("anonymous", "login"), ("operator", "dead-letters/replay"),
                      ("operator", "attempts/%s/resolve" % uuid.uuid4())):
        h = op.headers() if who == "operator" else {"Content-Type": "application/json"}
        try:
            got[path] = con.request(port, "POST", "/console/api/" + path, body, h, timeout=10)[0]
        except Exception as e:  # the connection closed without an answer
            got[path] = "no answer (%s)" % e.__class__.__name__
    e2e.log("answers: %s" % got)
    check(all(v == 400 for v in got.values()), "bad input not answered 400: %s" % got)


def random_letters(new):
    """Holds (a guard, for the sanitizer build): dead letters of random
    bytes (keys, values, header names and values, binary and invalid UTF-8,
    JSON of every shape) are listed, opened and previewed with 200 and the
    console lives. FUZZ_SEED reproduces it."""
    import os
    import random
    seed = int(os.environ.get("FUZZ_SEED", str(int(time.time()))))
    rnd = random.Random(seed)
    e2e.log("FUZZ_SEED=%d" % seed)
    s = new("console_adv_random_letters")
    name, port = con.start_console(s)
    op = con.Client(port, con.token(s, "olga", "operator"))
    pieces = [b"\x00", b"\xed\xa0\x80", b"\\u0000", CARD.encode(), CARD.encode() + b"e0",
              b"4242-4242-4242-4242", b"<x>", b"{", b"[", b"\"", b"null", b"1e999", b"-0",
              "\u00e9".encode() * 30, b"\x7f", "\u2028".encode(), b"\xff\xfe", b"\xc3"]

    def blob():
        return b"".join(rnd.choice(pieces + [bytes([rnd.randint(0, 255)])])
                        for _ in range(rnd.randint(0, 12)))

    def hname():
        return "".join(rnd.choice(["dlq.", "x-", "\u00e9", CARD, "a", "<", "\u2028"])
                       for _ in range(rnd.randint(1, 4)))
    recs = []
    for i in range(60):
        value = rnd.choice([blob(), json.dumps({blob().decode("latin-1"): blob().decode("latin-1"),
                                                "n": rnd.random() * 1e20}).encode(),
                            b"[" + b",".join([CARD.encode() + b"e0"] * rnd.randint(0, 5)) + b"]"])
        headers = [[hname(), {"hex": blob().hex()}] for _ in range(rnd.randint(0, 6))]
        if rnd.random() < 0.7:
            headers += [["dlq.reason", rnd.choice(["schema_violation", "card_data_refused", "x"])],
                        ["dlq.original.topic", s.topics["commands"]],
                        ["dlq.failed_at", {"hex": rnd.choice([b"2026-12-01T10:00:00.000Z", blob()]).hex()}]]
        recs.append({"key_hex": blob().hex(), "value_hex": value.hex(), "headers": headers})
    s.tool("produce", s.topics["dlq"], stdin="".join(json.dumps(r) + "\n" for r in recs).encode())
    e2e.wait_until("letters listed", lambda: len(con.letter_positions(op)) >= 60, 30)
    positions = [p for p, _ in con.letter_positions(op)]
    for p in positions:
        st, doc = op.get("dead-letters/" + p)
        check_eq(st, 200, "GET letter %s (seed %d)" % (p, seed))
    for i in range(0, len(positions), 7):
        st, doc = op.post("dead-letters/replay", {"positions": positions[i:i + 7], "dry_run": True})
        check(st in (200, 409), "preview %s: %s %s (seed %d)" % (positions[i:i + 7], st, doc, seed))
    check_eq(op.get("overview")[0], 200, "the overview")
    check(s.process(name).poll() is None, "the console died (seed %d)" % seed)


def force_booked_elsewhere(new):
    """Holds (a guard): force cannot book an intent another attempt paid
    with, not even two operators at once on two reviews; the ledger keeps
    one charge row per intent."""
    from test_chargectl_resolve import into_review
    s = new("console_adv_booked", worker_env={"RECONCILER_SEARCH_LAG_MS": "0"})
    s.start_worker()
    name, port = con.start_console(s)
    a = con.Client(port, con.token(s, "olga", "operator"))
    b = con.Client(port, con.token(s, "omar", "operator"))
    paid = e2e.new_command()
    s.publish([paid])
    e2e.wait_until("the paid attempt", lambda: s.query(
        "SELECT provider_payment_id FROM payment_attempts WHERE id = '%s' AND status = 'SUCCEEDED'"
        % paid["payment_attempt_id"]), 60)
    pi = s.query("SELECT provider_payment_id FROM payment_attempts WHERE id = '%s'"
                 % paid["payment_attempt_id"])[0][0]
    r1, pi1 = into_review(s, "pm_card_mastercard")
    r2, _ = into_review(s, "pm_card_mastercard")
    barrier = threading.Barrier(2)
    out = {}

    def go(c, r, pi=pi):
        barrier.wait()
        out[r["payment_attempt_id"]] = c.post(
            "attempts/%s/resolve" % r["payment_attempt_id"],
            {"decision": "succeeded", "payment_intent_id": pi, "force": True,
             "confirm": r["payment_attempt_id"]})
    ts = [threading.Thread(target=go, args=x) for x in ((a, r1), (b, r2))]
    for th in ts:
        th.start()
    for th in ts:
        th.join()
    e2e.log("forced on a paid intent: %s" % {k: v[0] for k, v in out.items()})
    check_eq(sorted(v[0] for v in out.values()), [409, 409], "force on an intent booked elsewhere")
    check_eq(s.query("SELECT count(*) FROM ledger_entries WHERE kind = 'charge' AND provider_payment_id = '%s'"
                     % pi), [["1"]], "charge rows of the intent")
    # One unbooked intent (r1's own), forced onto both reviews at once.
    barrier = threading.Barrier(2)
    out.clear()
    ts = [threading.Thread(target=go, args=x + (pi1["id"],)) for x in ((a, r1), (b, r2))]
    for th in ts:
        th.start()
    for th in ts:
        th.join()
    e2e.log("one free intent forced on two reviews: %s" % {k: (v[0], v[1].get("outcome")) for k, v in out.items()})
    check_eq(sorted(v[0] for v in out.values()), [200, 409], "one intent forced on two reviews at once")
    check_eq(s.query("SELECT count(*) FROM ledger_entries WHERE kind = 'charge' AND provider_payment_id = '%s'"
                     % pi1["id"]), [["1"]], "charge rows of the free intent")


def rss_kb(pid):
    with open("/proc/%d/status" % pid) as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1])
    return 0


def big_dlq_memory(new):
    """The overview (the page every sign-in lands on) and every dead-letter
    list, limit=1 included, read the whole dead-letter topic into the
    console's memory, every letter whole, once per request: the console's
    peak memory grows with the topic (here 5,000 letters of 16 KiB, 80 MB,
    a few of Kafka's 1 MB letters' worth), times the requests in hand."""
    s = new("console_adv_big_dlq")
    name, port = con.start_console(s)
    viewer = con.Client(port, con.token(s, "vera", "viewer"))
    pid = s.process(name).pid
    pad = "x" * 16384
    batch = "".join(json.dumps({"key": str(i), "value": json.dumps({"pad": pad, "i": i}),
                                "headers": [["dlq.reason", "schema_violation"]]}) + "\n"
                    for i in range(5000))
    s.tool("produce", s.topics["dlq"], stdin=batch.encode())
    before = rss_kb(pid)
    t0 = time.monotonic()
    ths = [threading.Thread(target=lambda: viewer.get("dead-letters?limit=1")) for _ in range(4)]
    for th in ths:
        th.start()
    for th in ths:
        th.join()
    dt = time.monotonic() - t0
    grown = (rss_kb(pid) - before) // 1024
    e2e.log("4 x GET dead-letters?limit=1 over 80 MB of letters: %.1fs, peak memory +%d MB" % (dt, grown))
    check(grown < 64, "four one-letter lists grew the console's peak memory by %d MB (%.1fs)" % (grown, dt))


def links_blank_the_page(new):
    """The page routes on location.hash: a link with a malformed escape
    (#/attempt/%E0%A4%A) or a name of Object.prototype (#/__proto__,
    #/constructor) throws in the router or runs Object's own functions as a
    page, and the operator who follows it gets a blank page."""
    import os
    import subprocess
    browser_dir = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "browser")
    s = new("console_adv_links")
    name, port = con.start_console(s, CONSOLE_COOKIE_SECURE="1")
    secret = con.token(s, "olga", "operator")
    hashes = ["#/overview", "#/attempt/%E0%A4%A", "#/__proto__", "#/constructor", "#/reviews/%"]
    env = dict(os.environ, CONSOLE_LINKS=json.dumps({"base": "http://127.0.0.1:%d" % port,
                                                     "token": secret, "hashes": hashes}))
    p = subprocess.run(["node", os.path.join(browser_dir, "console_links.mjs")], env=env,
                       capture_output=True, timeout=e2e.scaled(180), cwd=browser_dir)
    check(p.returncode == 0, "the browser failed: %s" % p.stderr.decode()[-2000:])
    saw = json.loads(p.stdout.decode().strip().splitlines()[-1])
    e2e.log("links: %s" % saw)
    check(saw["#/overview"]["h1"], "the overview itself shows nothing: %s" % saw)
    blank = {h: v for h, v in saw.items() if not v["h1"] or v["errors"]}
    check(not blank, "links that leave a blank page or a page error: %s" % blank)


def revoked_mid_resolve(new):
    """A token revoked (say, it leaked) while its resolution waits on the
    provider: the session was checked once, at the start, so the decision
    is written after the revocation, under the revoked token's name, and
    answered 200. Nothing re-checks the session when the write happens."""
    from test_chargectl_resolve import into_review
    s = new("console_adv_revoked_mid", worker_env={"RECONCILER_SEARCH_LAG_MS": "0"})
    s.start_worker()
    name, port = con.start_console(s, PROVIDER_TIMEOUT_MS="15000")
    mallory = con.Client(port, con.token(s, "leaked", "operator"))
    cmd, pi = into_review(s, "pm_card_mastercard")
    out = {}

    def go():
        # Forced: unforced, the intent (it only names the attempt) is
        # refused before anything is written, revoked or not.
        out["r"] = mallory.post("attempts/%s/resolve" % cmd["payment_attempt_id"],
                                {"decision": "succeeded", "payment_intent_id": pi["id"],
                                 "force": True, "confirm": cmd["payment_attempt_id"]})
    s.psp_freeze()
    try:
        th = threading.Thread(target=go)
        th.start()
        time.sleep(1.5)
        con.revoke(s, "leaked")
        check_eq(mallory.get("session")[0], 401, "the revoked session's next request")
    finally:
        s.psp_thaw()
    th.join()
    rows = s.query("SELECT t.actor, t.created_at > k.revoked_at FROM attempt_transitions t, console_tokens k"
                   " WHERE t.payment_attempt_id = '%s' AND t.cause = 'operator' AND k.name = 'leaked'"
                   % cmd["payment_attempt_id"])
    e2e.log("resolve by a token revoked mid-request: %s; transitions %s" % (out["r"][0], rows))
    check(not [r for r in rows if r[1] == "t"],
          "a decision written after its token was revoked: answered %s, %s" % (out["r"][0], rows))


def refused_resolutions_unrecorded(new):
    """docs/console.md: "Every action is written to console_actions (actor,
    action, target, outcome, detail): ... resolutions (refused ones too)".
    A resolution refused at the door (a viewer's, an operator's without its
    CSRF token, one from another origin) is answered 403 and written
    nowhere but the process log: who tried it is not in the record."""
    from test_chargectl_resolve import into_review
    s = new("console_adv_refused", worker_env={"RECONCILER_SEARCH_LAG_MS": "0"})
    s.start_worker()
    name, port = con.start_console(s)
    op = con.Client(port, con.token(s, "olga", "operator"))
    viewer = con.Client(port, con.token(s, "vera", "viewer"))
    cmd, pi = into_review(s, "pm_card_mastercard")
    path = "attempts/%s/resolve" % cmd["payment_attempt_id"]
    body = {"decision": "failed", "reason": "trying"}
    got = [viewer.post(path, body)[0], op.post(path, body, csrf=False)[0],
           op.post(path, body, extra={"Origin": "http://evil.example"})[0]]
    check_eq(got, [403, 403, 403], "the three refusals")
    rows = s.query("SELECT actor, outcome FROM console_actions WHERE action = 'resolve'")
    check(len(rows) >= 3, "three refused resolutions (vera; olga without CSRF; olga from"
          " another origin), recorded: %s" % rows)


def five_hundred_positions(new):
    """A replay preview of 500 letters (the most one request may name)
    reads each letter on its own (metadata, offsets, assign, poll), holding
    one of the listener threads, and all the connections it polls, that
    long: about 0.4 s a letter, over three minutes for 500 (the client
    gives up at 60 s); measured against a bound of 10 s."""
    s = new("console_adv_500")
    name, port = con.start_console(s)
    op = con.Client(port, con.token(s, "olga", "operator"))
    batch = "".join(json.dumps({"key": str(i), "value": json.dumps({"i": i}),
                                "headers": [["dlq.reason", "schema_violation"],
                                            ["dlq.original.topic", s.topics["commands"]]]}) + "\n"
                    for i in range(500))
    s.tool("produce", s.topics["dlq"], stdin=batch.encode())
    positions = e2e.wait_until("500 letters", lambda: (lambda p: p if len(p) == 500 else None)(
        [p for p, _ in con.letter_positions(op)]), 60)
    t0 = time.monotonic()
    try:
        st = con.request(port, "POST", "/console/api/dead-letters/replay",
                         json.dumps({"positions": positions, "dry_run": True}),
                         op.headers(), timeout=60)[0]
    except OSError as e:
        st = "no answer (%s)" % e.__class__.__name__
    dt = time.monotonic() - t0
    e2e.log("a preview of 500 letters: %s in %.1fs" % (st, dt))
    check(st == 200 and dt < 10, "a preview of 500 letters took %.1fs (%s)" % (dt, st))


def db_frozen(new):
    """Probe: PostgreSQL frozen (SIGSTOP). Each request is answered within
    a bound (a 503), and readiness says the database is gone."""
    s = new("console_adv_db_frozen")
    name, port = con.start_console(s)
    op = con.Client(port, con.token(s, "olga", "operator"))
    check_eq(timed_get(op, "session")[0], 200, "before")
    e2e.pg_freeze()
    try:
        res = [timed_get(op, p, timeout=40) for p in ("session", "reviews", "actions")]
        time.sleep(3)
        try:
            ready = s.admin_get(name, "/readyz")
        except Exception as e:
            ready = "no answer: %s" % e
    finally:
        e2e.pg_thaw()
    e2e.log("DB frozen: %s; readyz %s" % (res, ready))
    check(all(dt < 15 for _, dt in res), "requests with the database frozen: %s" % res)


def logout_that_does_not(new):
    """Signing out when the session's row cannot be deleted (here its table
    is locked past the console store's 2 s lock timeout): the console
    answers {"signed_out": true}, clears the cookie, records "logout ok",
    and the session goes on working for whoever holds its cookie (a shared
    machine, a copied cookie) until it expires, 8 h by default."""
    s = new("console_adv_logout")
    name, port = con.start_console(s)
    op = con.Client(port, con.token(s, "olga", "operator"))
    holder = e2e.Session(s.db)
    try:
        holder.run("BEGIN")
        holder.run("LOCK TABLE console_sessions IN EXCLUSIVE MODE")
        st, doc = op.post("logout", {})
        holder.run("COMMIT")
    finally:
        holder.close()
    after = op.get("session")[0]
    rows = s.query("SELECT outcome FROM console_actions WHERE action = 'logout'")
    e2e.log("logout: %s %s; the session afterwards: %s; recorded %s" % (st, doc, after, rows))
    check(not (st == 200 and after == 200),
          "signed out (%s %s, recorded %s) and the session still answers %s" % (st, doc, rows, after))


SCENARIOS = [logout_that_does_not, db_frozen, five_hundred_positions, refused_resolutions_unrecorded, revoked_mid_resolve, links_blank_the_page, big_dlq_memory, force_booked_elsewhere, random_letters, bad_input_no_answer, replay_to_any_topic, lookalike_actors, resolve_without_record, pan_as_json_number, slow_clients_lock_out, viewer_freezes_console, replay_races,
             transactional_letter]

if __name__ == "__main__":
    raise SystemExit(e2e.main(e2e.run_scenarios(SCENARIOS)))
