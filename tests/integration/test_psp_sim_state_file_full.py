#!/usr/bin/python3
"""psp-sim --state-file when its file cannot grow: test_psp_sim_state_file_full.py PSP_SIM.

psp-sim runs with RLIMIT_FSIZE a few kilobytes above its state file (and
SIGXFSZ ignored, so a write past it fails with EFBIG, as on a full disk).
Keys are charged one after another until a request gets no answer. Then
psp-sim is started again on the file, with no limit: every charge that was
answered must be in GET /ledger and replay its answer. A record that could
not be kept must not be answered as if it were.
"""
import os
import resource
import signal
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from test_psp_sim_restart_load import API_KEY, Sim, charge_form, fail  # noqa: E402

LIMIT_OVER_START = 4096  # bytes the file may grow by: a few charges


class LimitedSim(Sim):
    def start_limited(self, limit):
        def limit_file_size():
            resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))
            signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        args = [self.binary, "--port", "0", "--admin-port", "0", "--api-key",
                API_KEY, "--state-file", self.state_file]
        self.proc = subprocess.Popen(args, stdout=subprocess.DEVNULL,
                                     stderr=subprocess.PIPE, text=True,
                                     preexec_fn=limit_file_size)
        self.wait_listening()


def main():
    binary = sys.argv[1]
    with tempfile.TemporaryDirectory() as d:
        sim = LimitedSim(binary, os.path.join(d, "books.jsonl"))
        # The file as a first start leaves it (its settings), then the limit.
        sim.start()
        sim.kill()
        size = os.path.getsize(sim.state_file)
        sim.port = sim.admin_port = 0
        sim.start_limited(size + LIMIT_OVER_START)
        answered = {}
        for i in range(200):
            key = f"k-{i}"
            try:
                status, body, replayed = sim.post("/v1/payment_intents", key,
                                                  charge_form(key), timeout=5)
            except OSError:
                break  # no answer: psp-sim could not keep it
            if status in (200, 402):
                answered[key] = (status, body)
        if not answered:
            fail("no charge was answered before the file was full")
        if sim.proc.poll() is None:
            sim.kill()
        sim.start()
        books = sim.ledger()
        charged = {row["idempotency_key"] for row in books["charges"]}
        missing = sorted(k for k in answered if k not in charged)
        if missing:
            fail(f"{len(missing)} of {len(answered)} answered charges are not in "
                 f"the books after the restart (first: {missing[0]}): psp-sim "
                 f"answered changes it could not keep")
        for key, (status, body) in answered.items():
            got = sim.post("/v1/payment_intents", key, charge_form(key))
            if got != (status, body, True):
                fail(f"retry of {key}: {got[0]} {got[1]!r}, answered {status} {body!r}")
        sim.kill()
        print(f"ok: {len(answered)} charges answered before the file was full, "
              f"all kept")


if __name__ == "__main__":
    main()
