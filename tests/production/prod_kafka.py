"""The production profile's Kafka (deploy/production/kafka.sh) for scenarios.

ProdScenario is tests/e2e's Scenario on the three SASL_SSL brokers: its own
topics (replication factor 3, min.insync.replicas=2) and the workers' group,
made and granted by `kafka.sh provision` exactly as `up` grants the
contract's names, and every process reaching Kafka as its role's principal:
workers as charged-worker, the relay as charged-relay, commands published as
charged-orders (the order service), results read back as charged-orders,
the harness's own topic and lag checks as charged-admin.

CHARGED_PROD_STACK_DIR: the CHARGED_STACK_DIR the production stack was
started with (`deploy/stack.sh up --profile production`). Without it the
scenarios skip (exit 77). PostgreSQL is the test stack's
(CHARGED_TEST_DATABASE_URL) for now."""
import json
import os
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.normpath(os.path.join(HERE, "..", ".."))
sys.path.insert(0, os.path.join(ROOT, "tests", "e2e"))

import charged_e2e as e2e  # noqa: E402

KAFKA_SH = os.path.join(ROOT, "deploy", "production", "kafka.sh")
SKIP = 77
# The group the harness's `dump` reads with (kafka_test_tool): the order
# service's group stands in for it.
DUMP_GROUP = "kafka-test-tool-dump"


def stack_dir_or_skip():
    d = os.environ.get("CHARGED_PROD_STACK_DIR")
    if not d:
        print("SKIP: CHARGED_PROD_STACK_DIR is not set: start the production stack "
              "(CHARGED_STACK_DIR=DIR deploy/stack.sh up --profile production) and export "
              "CHARGED_PROD_STACK_DIR=DIR to run this test")
        sys.exit(SKIP)
    if not os.path.isdir(os.path.join(d, "kafka-prod", "secrets")):
        raise e2e.Failure("CHARGED_PROD_STACK_DIR=%s holds no production Kafka "
                          "(kafka-prod/secrets); run deploy/stack.sh up --profile production" % d)
    return d


def kafka_sh(*args, env=None, timeout=600):
    e = dict(os.environ)
    e["CHARGED_STACK_DIR"] = os.environ["CHARGED_PROD_STACK_DIR"]
    e.update(env or {})
    p = subprocess.run([KAFKA_SH] + list(args), capture_output=True, env=e,
                       stdin=subprocess.DEVNULL, timeout=e2e.scaled(timeout))
    if p.returncode != 0:
        raise e2e.Failure("kafka.sh %s exited %d: %s" % (
            " ".join(args), p.returncode, (p.stdout + p.stderr).decode()[-2000:]))
    return p.stdout.decode()


_role_env = {}


def role_env(role):
    """What `kafka.sh env ROLE` exports, less the topic and group names (a
    scenario names its own)."""
    if role not in _role_env:
        env = {}
        for line in kafka_sh("env", role).splitlines():
            if line.startswith("export ") and "=" in line:
                k, v = line[len("export "):].split("=", 1)
                env[k] = v.strip("'")
        for k in ("CHARGE_COMMANDS_TOPIC", "CHARGE_RESULTS_TOPIC", "CHARGE_DLQ_TOPIC",
                  "KAFKA_GROUP_ID"):
            env.pop(k, None)
        _role_env[role] = env
    return dict(_role_env[role])


def tool_env(role):
    """role_env for kafka_test_tool, which reads no NAME_FILE."""
    env = role_env(role)
    with open(env.pop("KAFKA_SASL_PASSWORD_FILE")) as f:
        env["KAFKA_SASL_PASSWORD"] = f.read().strip()
    return env


class ProdScenario(e2e.Scenario):
    def __init__(self, name, **kw):
        stack_dir_or_skip()
        os.environ.setdefault("CHARGED_TEST_KAFKA", role_env("admin")["KAFKA_BOOTSTRAP_SERVERS"])
        super().__init__(name, **kw)
        self.kafka = role_env("admin")["KAFKA_BOOTSTRAP_SERVERS"]
        self.provision()

    def provision(self):
        """The scenario's topics at RF 3 and the roles' ACLs on them and on
        its workers' group: `kafka.sh provision`, as `up` does for the
        contract's names."""
        kafka_sh("provision", env={
            "CHARGE_COMMANDS_TOPIC": self.topics["commands"],
            "CHARGE_RESULTS_TOPIC": self.topics["results"],
            "CHARGE_DLQ_TOPIC": self.topics["dlq"],
            "CHARGED_PROD_WORKER_GROUP": self.group,
            "CHARGED_PROD_ORDERS_GROUP": DUMP_GROUP,
        })

    def revoke(self, role, kind, name, operation):
        kafka_sh("revoke", role, kind, name, operation)

    def grant(self, role, kind, name, operation):
        kafka_sh("grant", role, kind, name, operation)

    def tool(self, *args, stdin=None, extra_env=None, role="admin"):
        if args and args[0] == "create-topic":
            return ""  # provision() makes them, at replication factor 3
        env = tool_env(role)
        env.update(extra_env or {})
        return super().tool(*args, stdin=stdin, extra_env=env)

    def start_worker(self, **extra_env):
        env = role_env("worker")
        env.update(extra_env)
        return super().start_worker(**env)

    def start_relay(self, **extra_env):
        env = role_env("relay")
        env.update(extra_env)
        return super().start_relay(**env)

    def publish(self, commands, role="orders"):
        """chargectl publish as the order service's principal."""
        data = "".join(json.dumps(c) + "\n" for c in commands).encode()
        self.run([e2e.CHARGECTL, "publish", "--file", "-"], stdin=data,
                 extra_env=role_env(role))

    def results(self):
        """The result events on the results topic, read as the order service."""
        out = self.tool("dump", self.topics["results"], role="orders")
        return [json.loads(l) for l in out.splitlines() if l.strip()]
