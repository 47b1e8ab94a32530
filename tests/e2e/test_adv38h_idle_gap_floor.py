#!/usr/bin/env python3
"""Adversary 38h, break: a window's served rate is taken over the time to
the answer that judges it, idle time included. Six charges, two of them
answered 429 once (strays: psp-sim has no limit), are eight answers: too few
to judge the window at a second, so it is judged at the first answer after
it is five seconds old. When the next work comes 8 s later, that answer is
the next burst's first: six served over ~9 s, an "overrun" at 0.7/s, the
pace cut to the floor (1/s). The burst's calls already in flight lift it
(+1/limit each: ~38/s after ~540 answers, ~63/s after ~1,030: as many as
went before the first answer came back), then it climbs 2-4/s a second:
3,000 charges must settle within 15 s. With 2,000: 1,271 and 1,207 did
(psp-sim 538 in the first second, then 38, 40, 42 ... 73), and one run of
three passed (1,032 in the first second, then 63, 67, 70 ... ~110). (test_adv38h_stray_pins_burst with six
charges and 8 s of nothing before the burst; the unit test
an_idle_gap_is_no_part_of_the_rate_served shows the cut alone: 100 served
in a second, judged a minute later, 2.27/s.)"""
import os

os.environ.setdefault("ADV_QUIET", "6")
os.environ.setdefault("ADV_IDLE_S", "8")
# up to WORKER_MAX_IN_FLIGHT (1,000) go before the first answer judges
os.environ.setdefault("ADV_N", "3000")

import charged_e2e as e2e  # noqa: E402
import test_adv38h_stray_pins_burst as stray  # noqa: E402


def scenario(new):
    stray.scenario(new, name="adv38h_idle")


if __name__ == "__main__":
    raise SystemExit(e2e.main(scenario))
