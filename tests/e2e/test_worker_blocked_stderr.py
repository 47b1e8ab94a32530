#!/usr/bin/env python3
"""A worker whose stderr nobody reads still exits within SHUTDOWN_TIMEOUT_MS.

With LOG_LEVEL=debug and librdkafka's debug output on, the worker fills a
pipe nobody reads: a thread then blocks in write() while holding the log
lock. The shutdown watchdog used to log before exiting, waited on that lock
forever, and the process never ended. Now it exits, at once on a second
SIGTERM and within the timeout on the first, whether or not its last line
could be written, also when stderr is full before the worker has even
started its loop."""
import fcntl
import os
import signal
import struct
import subprocess
import termios
import time

import charged_e2e as e2e
from charged_e2e import check

SHUTDOWN_MS = 3000


def unread_bytes(fd):
    return struct.unpack("i", fcntl.ioctl(fd, termios.FIONREAD, b"\0\0\0\0"))[0]


def blocked_writing(pid):
    """A thread of pid sleeps in a pipe write (Linux /proc)."""
    try:
        for t in os.listdir("/proc/%d/task" % pid):
            with open("/proc/%d/task/%s/wchan" % (pid, t)) as f:
                if f.read().strip() in ("pipe_write", "anon_pipe_write"):
                    return True
    except OSError:
        pass
    return False


def run_blocked(s, second_signal, full_from_start=False):
    env = s.env({"LOG_LEVEL": "debug", "KAFKA_DEBUG": "all",
                 "SHUTDOWN_TIMEOUT_MS": str(SHUTDOWN_MS),
                 "WORKER_ID": "blocked-stderr"})
    r, w = os.pipe()
    if full_from_start:
        # Full before the worker writes a byte: it blocks on its very first
        # log line, in start-up, before its loop ever turns.
        os.set_blocking(w, False)
        try:
            while True:
                os.write(w, b"x" * 4096)
        except BlockingIOError:
            pass
        os.set_blocking(w, True)
    p = subprocess.Popen([e2e.CHARGED, "worker"], stdout=w, stderr=w, env=env)
    os.close(w)
    try:
        # Full: within a log line of the 64 KiB a pipe buffer holds, and a
        # thread of the worker blocked writing to it.
        e2e.wait_until("the worker's stderr pipe to fill",
                       lambda: p.poll() is not None or unread_bytes(r) >= 60000, 60, 0.1)
        e2e.wait_until("a thread of the worker blocked on its stderr",
                       lambda: p.poll() is not None or blocked_writing(p.pid), 60, 0.05)
        check(p.poll() is None, "the worker exited %s before its stderr filled" % p.poll())
        t0 = time.monotonic()
        p.send_signal(signal.SIGTERM)
        if second_signal:
            time.sleep(0.3)
            t0 = time.monotonic()
            p.send_signal(signal.SIGTERM)
        allowed = 1.0 if second_signal else SHUTDOWN_MS / 1000.0 + 1.0
        try:
            rc = p.wait(timeout=e2e.scaled(allowed))
        except subprocess.TimeoutExpired:
            raise e2e.Failure("the worker still runs %.1fs after %s SIGTERM with a blocked "
                              "stderr" % (time.monotonic() - t0,
                                          "a second" if second_signal else "one")) from None
        e2e.log("exited %s after %.2fs (second signal: %s)" % (
            rc, time.monotonic() - t0, second_signal))
        check(rc == 1, "exit status %s, 1 expected (it could not finish cleanly)" % rc)
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()
        os.close(r)


def scenario(new):
    s = new("blocked_stderr", partitions=3)
    run_blocked(s, second_signal=False)
    run_blocked(s, second_signal=True)
    run_blocked(s, second_signal=False, full_from_start=True)


if __name__ == "__main__":
    raise SystemExit(e2e.main(scenario))
