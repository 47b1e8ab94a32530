"""The admin listener against hostile clients: 40 connections from one
address that trickle a header byte every second (never idle long enough to
be dropped) must not starve the probes of another address. Otherwise anyone
who can reach the admin port gets a healthy pod restarted by its liveness
probe."""

import socket
import threading
import time
import urllib.request

import charged_e2e as e2e
from charged_e2e import check, check_eq


def scenario(make):
    s = make("admin_hostile", partitions=1)
    w = s.start_worker()
    e2e.wait_until("w ready", lambda: s.admin_get(w, "/readyz")[0] == 200, 60)
    port = s.admin_port(w)
    slow, stop = [], threading.Event()
    for _ in range(40):
        c = socket.socket()
        c.bind(("127.0.0.2", 0))
        try:
            c.connect(("127.0.0.1", port))
            c.sendall(b"GET /healthz HTTP/1.1\r\nX-")
        except OSError:
            c.close()
            continue
        slow.append(c)

    def trickle():
        while not stop.is_set():
            for c in slow:
                try:
                    c.sendall(b"a")
                except OSError:
                    pass
            stop.wait(1)
    t = threading.Thread(target=trickle, daemon=True)
    t.start()
    failed, asked = [], 0
    try:
        t0 = time.monotonic()
        while time.monotonic() - t0 < 12:
            asked += 1
            try:
                with urllib.request.urlopen("http://127.0.0.1:%d/healthz" % port,
                                            timeout=e2e.scaled(2)) as r:
                    if r.status != 200:
                        failed.append(r.status)
            except OSError as err:
                failed.append(repr(err))
            time.sleep(0.5)  # the probes' pace, not a wait for a result
    finally:
        stop.set()
        t.join()
        for c in slow:
            c.close()
    check_eq(failed, [], "probes that failed (of %d) while 40 slow clients held on" % asked)
    check(s.workers[w].poll() is None, "the worker exited")


if __name__ == "__main__":
    raise SystemExit(e2e.main(scenario))
