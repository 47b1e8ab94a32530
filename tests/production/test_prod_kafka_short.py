#!/usr/bin/env python3
"""The production profile's Kafka faults in one short scenario, the test
command's form of the four scenarios beside it (their long forms run in
docs/testing.md's long suite): one provisioning of topics and ACLs, 60
commands, and in turn

- TLS material and credentials (test_prod_kafka_tls): a worker given a CA
  that did not sign the brokers, then the wrong password, says one line
  and exits 2;
- broker kills (test_prod_kafka_kills): SIGKILL of the commands topic's
  partition leader, the results topic's, the group coordinator, each
  started again, commands published while each is down;
- a revoked ACL (test_prod_kafka_revoked): the worker loses Read on its
  group: /readyz 503 naming it, one log line, no exit; granted again, it
  is ready and charges what was published meanwhile;
- the ACL table (test_prod_kafka): the worker may not write commands.

Judged from psp-sim's ledger (check_invariants: each command charged
once), the attempts and the results topic (every attempt's event).

Skips (77) unless CHARGED_PROD_STACK_DIR names a running production stack."""
import json
import os

import prod_kafka
import test_prod_kafka_kills as kills
import test_prod_kafka_revoked as revoked
import test_prod_kafka_tls as tls
from prod_kafka import e2e
from charged_e2e import check, check_eq

N = 60


def scenario(new):
    s = new("prod_short")
    other = tls.other_ca(s.dir)
    tls.start_fails(s, "worker", {"KAFKA_SSL_CA_LOCATION": other},
                    "does not verify against KAFKA_SSL_CA_LOCATION (%s)" % other)
    wrong_password = os.path.join(s.dir, "wrong.password")
    with open(wrong_password, "w") as f:
        f.write("not-the-password\n")
    tls.start_fails(s, "worker", {"KAFKA_SASL_PASSWORD_FILE": wrong_password},
                    "Kafka refused the SASL credentials of KAFKA_SASL_USERNAME "
                    "'charged-worker'")

    w = s.start_worker()
    s.start_worker()
    s.start_relay(RELAY_POLL_MS="100")
    cmds = kills.commands(N)
    chunks = [cmds[i:i + N // 5] for i in range(0, N, N // 5)]
    s.publish(chunks[0])
    killed = kills.kill_each(s, lambda i: s.publish(chunks[1 + i]))
    e2e.wait_until("the worker ready", lambda: revoked.ready(s, w)[0] == 200, 120)
    revoked.revoke_group_read(s, w, 5, lambda: s.publish(chunks[4]))

    s.wait_settled(N, timeout=300)
    s.check_invariants()
    attempts = s.attempts()
    check_eq(len(attempts), N, "attempts recorded")
    check_eq(sum(a["status"] == "FAILED" for a in attempts), N // 10, "declined attempts")
    kills.check_results(s, attempts)

    env = prod_kafka.role_env("worker")
    env["CHARGE_COMMANDS_TOPIC"] = s.topics["commands"]
    p = s.run([e2e.CHARGECTL, "publish", "--file", "-"], check=False, extra_env=env,
              stdin=(json.dumps(e2e.new_command()) + "\n").encode())
    check(p.returncode != 0 and b"not published" in p.stderr,
          "charged-worker wrote to the commands topic (exit %d: %s)"
          % (p.returncode, p.stderr.decode()[-300:]))
    e2e.log("%d attempts settled once, every result published; nodes killed: %s"
            % (N, killed))


if __name__ == "__main__":
    prod_kafka.stack_dir_or_skip()
    e2e.Scenario = prod_kafka.ProdScenario  # main()'s factory makes (and closes) these
    raise SystemExit(e2e.main(scenario))
