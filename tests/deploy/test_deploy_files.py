#!/usr/bin/env python3
"""Structural checks of the deployment files in deploy/, one area per run:

  test_deploy_files.py kubernetes     deploy/kubernetes (kustomize dirs)
  test_deploy_files.py compose        deploy/compose/compose.yaml
  test_deploy_files.py image          deploy/docker/Dockerfile
  test_deploy_files.py settings       every role started with the environment
                                      the manifests and compose give it
  test_deploy_files.py observability  alert rules, dashboard, scrape configs, runbook

The files are read as data and checked for charged's own rules, what a
deployment depends on; field names and types are the schemas' business
(test_manifest_schemas.py), the image is built by test_image_build: probes on the
admin port, grace periods longer than the drain, non-root containers,
secrets only by reference, one partition count everywhere, metric names
that exist in the dashboard and the alert rules. Each area also re-runs some checks on deliberately broken
copies of the files and requires them to fail, so a check that can no
longer see anything fails too. Needs python3-yaml, no servers.
"""
import copy
import glob
import json
import os
import re
import shlex
import signal
import subprocess
import sys
import tempfile
import threading

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "e2e"))
from charged_e2e import Failure, check, check_eq, free_port, wait_until  # noqa: E402

import yaml  # noqa: E402  (python3-yaml)

ROOT = os.environ.get("CHARGED_SOURCE_DIR") or os.path.normpath(os.path.join(HERE, "..", ".."))
DEPLOY = os.path.join(ROOT, "deploy")
K8S = os.path.join(DEPLOY, "kubernetes")

ROLES = ("worker", "reconciler", "relay", "api", "auditor", "console")
ADMIN_PORT = 9400
COMMANDS_TOPIC = "payments.charge.commands"
WORKER_GROUP = "charged-worker"  # KAFKA_GROUP_ID's default for the worker
SECRET_VARS = ("DATABASE_URL", "PROVIDER_API_KEY", "WEBHOOK_SIGNING_SECRET")
# The secrets each program reads (docs/configuration.md).
SECRETS_READ = {
    "worker": {"DATABASE_URL", "PROVIDER_API_KEY"},
    "reconciler": {"DATABASE_URL", "PROVIDER_API_KEY"},
    "relay": {"DATABASE_URL"},
    "api": {"DATABASE_URL", "WEBHOOK_SIGNING_SECRET"},
    "auditor": {"DATABASE_URL", "PROVIDER_API_KEY"},
    # A review is checked with the provider before anything is written.
    "console": {"DATABASE_URL", "PROVIDER_API_KEY"},
    "migrate": {"DATABASE_URL"},
    # The CronJob charged-audit: `chargectl audit run` asks the provider.
    "audit": {"DATABASE_URL", "PROVIDER_API_KEY"},
}
# Margin of a grace period over the drain it must hold (SIGKILL after it).
GRACE_MARGIN_MS = 10000

# Metric families every role may export (name -> (type, labels)). When
# common/runtime/metrics.c exists its names are the truth (see known_metrics()).
METRICS = {
    "charged_messages_total": ("counter", {"outcome"}),
    "charged_attempts_processed_total": ("counter", {"status"}),
    "charged_provider_request_duration_seconds": ("histogram", {"operation"}),
    "charged_provider_responses_total": ("counter", {"operation", "class"}),
    "charged_provider_calls_in_flight": ("gauge", set()),
    "charged_consumer_lag_messages": ("gauge", {"topic", "partition"}),
    "charged_dead_letters_total": ("counter", {"reason"}),
    "charged_rebalances_total": ("counter", {"kind"}),
    "charged_reconciler_backlog_attempts": ("gauge", {"status"}),
    "charged_reconciler_oldest_attempt_age_seconds": ("gauge", {"status"}),
    "charged_reconciler_settlements_total": ("counter", {"status"}),
    "charged_outbox_backlog_events": ("gauge", set()),
    "charged_outbox_oldest_event_age_seconds": ("gauge", set()),
    "charged_outbox_published_total": ("counter", set()),
    "charged_outbox_publish_failures_total": ("counter", set()),
    "charged_webhook_deliveries_total": ("counter", {"result"}),
    "charged_provider_breaker_state": ("gauge", set()),
    "charged_provider_breaker_opens_total": ("counter", set()),
    "charged_ready": ("gauge", set()),
}
# Families the alerts use that the dashboard does not show: their names
# and labels are checked like the others', and no panel is required.
ALERT_METRICS = {
    "charged_audit_findings_total": ("counter", {"kind"}),
    "charged_audit_objects_total": ("counter", {"object"}),
    "charged_audit_windows_total": ("counter", set()),
    "charged_audit_watermark_age_seconds": ("gauge", set()),
    "charged_audit_pending_objects": ("gauge", set()),
}
# Labels Prometheus adds (scrape configs in deploy/prometheus).
TARGET_LABELS = {"role", "instance", "job", "namespace", "le"}


def kafka_image():
    """Apache's image of the Kafka the local stack and the tests run."""
    m = re.search(r"<kafka.version>([^<]+)</kafka.version>", read(os.path.join(DEPLOY, "kafka", "pom.xml")))
    return "apache/kafka:" + m.group(1)


def read(path):
    with open(path, encoding="utf-8") as f:
        return f.read()


def rel(path):
    return os.path.relpath(path, ROOT)


# --------------------------------------------------------------------------
# Kubernetes

# Field names and types are the schemas' (tests/deploy/test_manifest_schemas.py:
# kubernetes-validate, strict, and KEDA's CRD): the checks here are charged's
# own rules, which no schema knows.
API_VERSIONS = {
    "Deployment": "apps/v1", "StatefulSet": "apps/v1", "Job": "batch/v1",
    "PodDisruptionBudget": "policy/v1", "Service": "v1", "ConfigMap": "v1",
    "ServiceAccount": "v1", "ScaledObject": "keda.sh/v1alpha1", "CronJob": "batch/v1",
}
WORKLOADS = ("Deployment", "StatefulSet")


def load_kubernetes():
    """{'dirs': {dir: kustomization}, 'objects': [(file, doc)]}: every
    kustomize directory under deploy/kubernetes and every object of the
    resource files they list."""
    dirs, objects, files, patches = {}, [], [], set()
    for k in sorted(glob.glob(os.path.join(K8S, "**", "kustomization.yaml"), recursive=True)):
        d = rel(os.path.dirname(k))
        dirs[d] = yaml.safe_load(read(k))
        patches |= {os.path.normpath(os.path.join(d, p["path"]))
                    for p in dirs[d].get("patches", []) if "path" in p}
    for path in sorted(glob.glob(os.path.join(K8S, "**", "*.yaml"), recursive=True)):
        if os.path.basename(path) == "kustomization.yaml":
            continue
        files.append(rel(path))
        if rel(path) in patches:  # a partial object, merged by kustomize
            continue
        for doc in yaml.safe_load_all(read(path)):
            if doc is not None:
                objects.append((rel(path), doc))
    return {"dirs": dirs, "objects": objects, "files": files}


def objs(ctx, kind=None, name=None):
    return [d for _, d in ctx["objects"]
            if (kind is None or d.get("kind") == kind)
            and (name is None or d.get("metadata", {}).get("name") == name)]


def one(ctx, kind, name):
    found = objs(ctx, kind, name)
    check(len(found) == 1, "want one %s %s, found %d" % (kind, name, len(found)))
    return found[0]


def template_of(d):
    """The pod template of a workload, a Job or a CronJob."""
    if d["kind"] == "CronJob":
        return d["spec"]["jobTemplate"]["spec"]["template"]
    return d["spec"]["template"]


def pod_templates(ctx, kinds=WORKLOADS + ("Job", "CronJob")):
    """(kind, name, template) of every workload, Job and CronJob."""
    return [(d["kind"], d["metadata"]["name"], template_of(d))
            for d in objs(ctx) if d.get("kind") in kinds]


def role_of(name):
    return name[len("charged-"):] if name.startswith("charged-") else name


def env_of(container):
    return {e["name"]: e for e in container.get("env", [])}


def partitions_in(text, topic):
    """The --partitions of `--topic <topic>` in a kafka-topics command text."""
    counts = [int(m.group(1)) for line in text.splitlines()
              if re.search(r"--topic\s+%s(\s|$)" % re.escape(topic), line)
              for m in [re.search(r"--partitions\s+(\d+)", line)] if m]
    check_eq(len(counts), 1, "lines creating %s with --partitions" % topic)
    return counts[0]


def topics_job_partitions(ctx):
    job = one(ctx, "Job", "charged-topics")
    text = "\n".join(job["spec"]["template"]["spec"]["containers"][0]["args"])
    return partitions_in(text, COMMANDS_TOPIC)


def compose_partitions():
    compose = yaml.safe_load(read(os.path.join(DEPLOY, "compose", "compose.yaml")))
    command = compose["services"]["kafka-topics"]["command"]
    return partitions_in("\n".join(command if isinstance(command, list) else [command]),
                         COMMANDS_TOPIC)


def stack_partitions():
    text = read(os.path.join(DEPLOY, "stack.sh"))
    m = re.search(r'create_topic "\$have" "\$commands_topic" (\d+)', text)
    check(m, "deploy/stack.sh: no create_topic line for the commands topic")
    return int(m.group(1))


def k8s_objects_are_well_formed(ctx):
    check(ctx["objects"], "no Kubernetes objects found under deploy/kubernetes")
    for f, d in ctx["objects"]:
        kind = d.get("kind")
        check(kind in API_VERSIONS, "%s: unexpected kind %r" % (f, kind))
        check_eq(d.get("apiVersion"), API_VERSIONS[kind], "%s: apiVersion of %s" % (f, kind))
        md = d.get("metadata", {})
        check(md.get("name"), "%s: a %s without metadata.name" % (f, kind))
        check("namespace" not in md,
              "%s: %s %s names a namespace; the manifests are applied to any" % (f, kind, md.get("name")))
    names = [(d["kind"], d["metadata"]["name"]) for _, d in ctx["objects"]]
    check_eq(len(names), len(set(names)), "distinct (kind, name) pairs")


def k8s_kustomizations_list_every_file(ctx):
    listed = set()
    for d, k in ctx["dirs"].items():
        for r in k.get("resources", []):
            target = os.path.normpath(os.path.join(ROOT, d, r))
            if os.path.isdir(target):
                check(os.path.exists(os.path.join(target, "kustomization.yaml")),
                      "%s: resource %s is a directory without kustomization.yaml" % (d, r))
            else:
                check(os.path.isfile(target), "%s: resource %s does not exist" % (d, r))
                listed.add(rel(target))
        for p in k.get("patches", []):
            if "path" in p:
                target = os.path.normpath(os.path.join(ROOT, d, p["path"]))
                check(os.path.isfile(target), "%s: patch %s does not exist" % (d, p["path"]))
                listed.add(rel(target))
    for f in ctx["files"]:
        check(f in listed, "%s is in no kustomization: it would never be applied" % f)
    for want in ("roles", "before-rollout", "roles-without-keda", "shared"):
        check(os.path.join("deploy", "kubernetes", want) in ctx["dirs"],
              "deploy/kubernetes/%s/kustomization.yaml is missing" % want)


def k8s_every_role_has_its_workload(ctx):
    for role in ROLES:
        kind = "StatefulSet" if role == "worker" else "Deployment"
        w = one(ctx, kind, "charged-" + role)
        c = w["spec"]["template"]["spec"]["containers"]
        check_eq(len(c), 1, "containers of %s charged-%s" % (kind, role))
        check_eq(c[0].get("image"), "charged", "image of charged-%s" % role)
        check_eq(c[0].get("args"), [role], "args of charged-%s (the image's entrypoint is charged)" % role)
        check("command" not in c[0], "charged-%s overrides the entrypoint" % role)
    job = one(ctx, "Job", "charged-migrate")
    c = job["spec"]["template"]["spec"]["containers"][0]
    check_eq((c.get("image"), c.get("command"), c.get("args")),
             ("charged", ["chargectl"], ["migrate"]), "the migration Job's container")
    topics = one(ctx, "Job", "charged-topics")
    check_eq(topics["spec"]["template"]["spec"]["containers"][0]["image"], kafka_image(),
             "image of the topics Job")
    for kind in WORKLOADS:
        for w in objs(ctx, kind):
            check(role_of(w["metadata"]["name"]) in ROLES,
                  "%s %s is no role of charged" % (kind, w["metadata"]["name"]))


def k8s_images_agree(ctx):
    tags = {}
    for d, k in ctx["dirs"].items():
        for img in k.get("images", []):
            tags.setdefault(img["name"], set()).add((img.get("newName"), img.get("newTag")))
    check("charged" in tags, "no kustomization sets the charged image")
    check_eq(len(tags["charged"]), 1, "distinct charged images set by the kustomizations %s" % tags)
    for d in ("roles", "before-rollout"):
        k = ctx["dirs"][os.path.join("deploy", "kubernetes", d)]
        check([i for i in k.get("images", []) if i["name"] == "charged"],
              "deploy/kubernetes/%s does not set the charged image" % d)
    for kind, name, t in pod_templates(ctx):
        for c in t["spec"]["containers"]:
            check(not c["image"].endswith(":latest"), "%s %s uses a :latest image" % (kind, name))


def k8s_probes_use_the_admin_port(ctx):
    for kind, name, t in pod_templates(ctx, WORKLOADS):
        for c in t["spec"]["containers"]:
            where = "%s %s container %s" % (kind, name, c["name"])
            ports = {p.get("name"): p["containerPort"] for p in c.get("ports", [])}
            check_eq(ports.get("admin"), ADMIN_PORT, where + ": containerPort named admin")
            check_eq(env_of(c).get("ADMIN_ADDR", {}).get("value"), "0.0.0.0:%d" % ADMIN_PORT,
                     where + ": ADMIN_ADDR (the loopback default is unreachable by the kubelet)")
            want = {"livenessProbe": "/healthz", "readinessProbe": "/readyz",
                    "startupProbe": "/healthz"}
            for probe, path in want.items():
                if probe == "startupProbe" and probe not in c:
                    continue
                check(probe in c, "%s: no %s" % (where, probe))
                get = c[probe].get("httpGet")
                check(get, "%s: %s is not an HTTP GET" % (where, probe))
                check_eq((get.get("path"), get.get("port")), (path, "admin"),
                         "%s: %s path and port" % (where, probe))


def prestop_sleep_seconds(container):
    """What the container's preStop hook sleeps, in seconds (0 without one)."""
    hook = container.get("lifecycle", {}).get("preStop")
    if not hook:
        return 0
    if "sleep" in hook:
        return int(hook["sleep"]["seconds"])
    cmd = hook.get("exec", {}).get("command", [])
    check(len(cmd) == 2 and cmd[0] == "sleep" and cmd[1].isdigit(),
          "preStop %r: only a plain sleep is understood here" % cmd)
    return int(cmd[1])


def k8s_grace_outlasts_the_drain(ctx):
    for kind, name, t in pod_templates(ctx, WORKLOADS):
        spec = t["spec"]
        check("terminationGracePeriodSeconds" in spec,
              "%s %s: no terminationGracePeriodSeconds (the default 30 s is no choice)" % (kind, name))
        grace_ms = spec["terminationGracePeriodSeconds"] * 1000
        for c in spec["containers"]:
            e = env_of(c).get("SHUTDOWN_TIMEOUT_MS")
            check(e and "value" in e,
                  "%s %s: SHUTDOWN_TIMEOUT_MS is not set in the pod spec" % (kind, name))
            need = int(e["value"]) + prestop_sleep_seconds(c) * 1000 + GRACE_MARGIN_MS
            check(grace_ms >= need,
                  "%s %s: grace period %d ms < SHUTDOWN_TIMEOUT_MS %s + preStop + %d ms margin" % (
                      kind, name, grace_ms, e["value"], GRACE_MARGIN_MS))


def k8s_containers_run_unprivileged(ctx):
    for kind, name, t in pod_templates(ctx):
        spec = t["spec"]
        sc = spec.get("securityContext", {})
        check(sc.get("runAsNonRoot") is True, "%s %s: runAsNonRoot is not true" % (kind, name))
        check(isinstance(sc.get("runAsUser"), int) and sc["runAsUser"] > 0,
              "%s %s: runAsUser %r" % (kind, name, sc.get("runAsUser")))
        check(spec.get("automountServiceAccountToken") is False,
              "%s %s mounts a service account token it never uses" % (kind, name))
        check(not spec.get("hostNetwork") and not spec.get("hostPID"),
              "%s %s shares the host's namespaces" % (kind, name))
        for c in spec["containers"]:
            csc = c.get("securityContext", {})
            where = "%s %s container %s" % (kind, name, c["name"])
            check(csc.get("allowPrivilegeEscalation") is False, where + ": privilege escalation allowed")
            check(csc.get("readOnlyRootFilesystem") is True, where + ": root filesystem writable")
            check(not csc.get("privileged"), where + ": privileged")
            check("ALL" in csc.get("capabilities", {}).get("drop", []),
                  where + ": capabilities not dropped")
            check(csc.get("runAsUser", 1) != 0, where + ": runs as root")


def looks_secret(value):
    return bool(re.search(r"sk_(live|test)_|whsec_|rk_live_|://[^/\s:@]+:[^/\s@]+@", value))


def k8s_secrets_only_by_reference(ctx):
    check(not objs(ctx, "Secret"), "a Secret with values is part of the manifests")
    for cm in objs(ctx, "ConfigMap"):
        for k, v in cm.get("data", {}).items():
            check(k not in SECRET_VARS and not k.endswith("_FILE") and not looks_secret(v),
                  "ConfigMap %s holds a secret: %s" % (cm["metadata"]["name"], k))
    for kind, name, t in pod_templates(ctx):
        spec = t["spec"]
        secret_dirs = {}
        vols = {v["name"]: v for v in spec.get("volumes", [])}
        for c in spec["containers"]:
            for m in c.get("volumeMounts", []):
                v = vols.get(m["name"])
                check(v is not None, "%s %s: mount of unknown volume %s" % (kind, name, m["name"]))
                if "secret" in v:
                    check(m.get("readOnly") is True,
                          "%s %s: secret volume mounted writable" % (kind, name))
                    check_eq(v["secret"].get("secretName"), "charged-secrets",
                             "%s %s: secret volume's secretName" % (kind, name))
                    secret_dirs[m["mountPath"]] = {i["path"] for i in v["secret"].get("items", [])}
            got = set()
            for e in c.get("env", []):
                n = e["name"]
                where = "%s %s: env %s" % (kind, name, n)
                check("value" not in e or not looks_secret(str(e["value"])),
                      where + " holds what looks like a secret")
                if n in SECRET_VARS:
                    ref = e.get("valueFrom", {}).get("secretKeyRef")
                    check(ref and ref.get("name") == "charged-secrets",
                          where + ": a secret given other than by reference")
                    got.add(n)
                elif n.endswith("_FILE") and n[:-5] in SECRET_VARS:
                    d, f = os.path.split(e.get("value", ""))
                    check(f in secret_dirs.get(d, ()),
                          where + ": %r is not a file of a mounted secret volume" % e.get("value"))
                    got.add(n[:-5])
            if kind == "Job" and name == "charged-topics":
                check_eq(got, set(), "secrets of the topics Job")
                continue
            role = role_of(name)
            check_eq(got, SECRETS_READ[role], "secrets given to %s %s" % (kind, name))


def k8s_containers_have_resources(ctx):
    for kind, name, t in pod_templates(ctx):
        for c in t["spec"]["containers"]:
            r = c.get("resources", {})
            for part in ("requests", "limits"):
                for res in ("cpu", "memory"):
                    check(res in r.get(part, {}),
                          "%s %s container %s: no %s.%s" % (kind, name, c["name"], part, res))


def k8s_workers_fit_the_partitions(ctx):
    p = topics_job_partitions(ctx)
    check_eq(compose_partitions(), p, "partitions of %s in compose vs the topics Job" % COMMANDS_TOPIC)
    check_eq(stack_partitions(), p, "partitions of %s in deploy/stack.sh vs the topics Job" % COMMANDS_TOPIC)
    so = one(ctx, "ScaledObject", "charged-worker")
    check_eq(so["spec"]["maxReplicaCount"], p, "KEDA maxReplicaCount vs the partition count")
    check(1 <= so["spec"]["minReplicaCount"] <= so["spec"]["maxReplicaCount"],
          "KEDA minReplicaCount %r" % so["spec"]["minReplicaCount"])
    sts = one(ctx, "StatefulSet", "charged-worker")
    check("replicas" not in sts["spec"],
          "the worker StatefulSet sets replicas; KEDA owns them (each apply would reset them)")
    overlay = yaml.safe_load(read(os.path.join(K8S, "roles-without-keda", "worker-replicas.yaml")))
    check_eq((overlay["kind"], overlay["metadata"]["name"]), ("StatefulSet", "charged-worker"),
             "what roles-without-keda patches")
    check(1 <= overlay["spec"]["replicas"] <= p,
          "roles-without-keda: %r workers for %d partitions" % (overlay["spec"]["replicas"], p))


def k8s_keda_watches_the_workers_group(ctx):
    so = one(ctx, "ScaledObject", "charged-worker")
    check_eq(so["spec"]["scaleTargetRef"], {"apiVersion": "apps/v1", "kind": "StatefulSet",
                                            "name": "charged-worker"}, "KEDA scaleTargetRef")
    cm = one(ctx, "ConfigMap", "charged-config")["data"]
    triggers = so["spec"]["triggers"]
    check_eq([t["type"] for t in triggers], ["kafka"], "KEDA trigger types")
    md = triggers[0]["metadata"]
    worker = one(ctx, "StatefulSet", "charged-worker")["spec"]["template"]["spec"]["containers"][0]
    group = env_of(worker).get("KAFKA_GROUP_ID", {}).get("value", WORKER_GROUP)
    check_eq(md.get("consumerGroup"), group, "KEDA consumerGroup")
    check_eq(md.get("topic"), cm.get("CHARGE_COMMANDS_TOPIC", COMMANDS_TOPIC), "KEDA topic")
    check_eq(md.get("bootstrapServers"), cm["KAFKA_BOOTSTRAP_SERVERS"], "KEDA bootstrapServers")
    check(md.get("lagThreshold", "").isdigit() and int(md["lagThreshold"]) > 0,
          "KEDA lagThreshold %r" % md.get("lagThreshold"))
    check_eq(md.get("offsetResetPolicy"), "earliest", "KEDA offsetResetPolicy (the worker's)")


def k8s_workers_have_stable_names(ctx):
    sts = one(ctx, "StatefulSet", "charged-worker")
    spec = sts["spec"]
    check(not spec.get("volumeClaimTemplates"), "the worker StatefulSet claims volumes")
    svc = one(ctx, "Service", spec["serviceName"])
    check_eq(svc["spec"].get("clusterIP"), "None", "clusterIP of the worker's governing Service")
    c = spec["template"]["spec"]["containers"][0]
    e = env_of(c)
    check_eq(e.get("POD_NAME", {}).get("valueFrom"), {"fieldRef": {"fieldPath": "metadata.name"}},
             "POD_NAME of the worker (its group.instance.id)")
    check("KAFKA_GROUP_INSTANCE_ID" not in e,
          "KAFKA_GROUP_INSTANCE_ID is set: every worker would claim the same instance id")
    sess = int(e.get("KAFKA_SESSION_TIMEOUT_MS", {}).get("value", "45000"))
    check(sess >= 30000, "session.timeout.ms %d: too short for a worker to restart within" % sess)


def labels_match(selector, labels):
    return all(labels.get(k) == v for k, v in selector.items())


def k8s_selectors_and_budgets(ctx):
    for kind in WORKLOADS:
        for w in objs(ctx, kind):
            name = w["metadata"]["name"]
            sel = w["spec"]["selector"]["matchLabels"]
            tl = w["spec"]["template"]["metadata"]["labels"]
            check(labels_match(sel, tl), "%s %s: selector does not match its pods" % (kind, name))
            pdbs = [p for p in objs(ctx, "PodDisruptionBudget")
                    if labels_match(p["spec"]["selector"]["matchLabels"], tl)]
            check_eq(len(pdbs), 1, "PodDisruptionBudgets covering %s %s" % (kind, name))
            spec = pdbs[0]["spec"]
            if "maxUnavailable" in spec:
                check(isinstance(spec["maxUnavailable"], int) and spec["maxUnavailable"] >= 1,
                      "PDB of %s: maxUnavailable %r blocks every drain" % (name, spec["maxUnavailable"]))
            else:
                replicas = w["spec"].get("replicas")
                if replicas is None:
                    replicas = one(ctx, "ScaledObject", name)["spec"]["minReplicaCount"]
                check(spec["minAvailable"] < replicas,
                      "PDB of %s: minAvailable %r of %d replicas blocks every drain" % (
                          name, spec["minAvailable"], replicas))
    for p in objs(ctx, "PodDisruptionBudget"):
        check(any(labels_match(p["spec"]["selector"]["matchLabels"],
                               w["spec"]["template"]["metadata"]["labels"])
                  for k in WORKLOADS for w in objs(ctx, k)),
              "PDB %s covers no workload" % p["metadata"]["name"])


def k8s_services_reach_their_listeners(ctx):
    """charged-api and charged-console select their pods and target the
    port their listener binds; the console's stays inside the cluster (it
    faces operators, never the provider or the internet)."""
    for role, addr_var in (("api", "API_ADDR"), ("console", "CONSOLE_ADDR")):
        svc = one(ctx, "Service", "charged-" + role)
        w = one(ctx, "Deployment", "charged-" + role)
        t = w["spec"]["template"]
        check(labels_match(svc["spec"]["selector"], t["metadata"]["labels"]),
              "Service charged-%s does not select the %s pods" % (role, role))
        c = t["spec"]["containers"][0]
        ports = {p.get("name"): p["containerPort"] for p in c["ports"]}
        addr = env_of(c).get(addr_var, {}).get("value", "")
        for sp in svc["spec"]["ports"]:
            check(sp["targetPort"] in ports, "Service port %s targets no container port" % sp)
            check_eq(addr, "0.0.0.0:%d" % ports[sp["targetPort"]],
                     "%s vs the port the Service targets" % addr_var)
    console = one(ctx, "Service", "charged-console")["spec"]
    check_eq(console.get("type", "ClusterIP"), "ClusterIP",
             "Service charged-console type (internal only)")


def duration_s(text):
    """chargectl audit's durations: 90s, 30m, 24h, 7d."""
    m = re.fullmatch(r"(\d+)([smhd])", text)
    check(m, "duration %r" % text)
    return int(m.group(1)) * {"s": 1, "m": 60, "h": 3600, "d": 86400}[m.group(2)]


def k8s_daily_audit_covers_a_day(ctx):
    """The auditor reads each window's list once; the CronJob charged-audit
    audits the last day again (docs/auditor.md, "What it cannot see"). Run
    once a day, it must reach back a whole day at least, never run twice at
    once, and not retry a run that exited 1 on a finding."""
    cj = one(ctx, "CronJob", "charged-audit")
    spec = cj["spec"]
    fields = spec["schedule"].split()
    check(len(fields) == 5 and fields[0].isdigit() and fields[1].isdigit() and
          fields[2:] == ["*", "*", "*"],
          "CronJob charged-audit: schedule %r is not once a day" % spec["schedule"])
    check_eq(spec.get("concurrencyPolicy"), "Forbid", "concurrencyPolicy of charged-audit")
    check_eq(spec["jobTemplate"]["spec"].get("backoffLimit"), 0,
             "backoffLimit of charged-audit (a finding is exit 1; a retry finds it again)")
    t = template_of(cj)["spec"]
    check_eq(t.get("restartPolicy"), "Never", "restartPolicy of charged-audit")
    c = t["containers"]
    check_eq(len(c), 1, "containers of charged-audit")
    check_eq((c[0].get("image"), c[0].get("command")), ("charged", ["chargectl"]),
             "image and command of charged-audit")
    args = c[0].get("args", [])
    check(args[:2] == ["audit", "run"] and "--since" in args,
          "charged-audit does not run chargectl audit run --since: %r" % args)
    since = duration_s(args[args.index("--since") + 1])
    until = duration_s(args[args.index("--until") + 1]) if "--until" in args else 0
    check(since - until >= 86400,
          "charged-audit audits %d s a day: less than the day between two runs" % (since - until))


KUBERNETES_CHECKS = [
    k8s_objects_are_well_formed, k8s_kustomizations_list_every_file,
    k8s_every_role_has_its_workload, k8s_images_agree,
    k8s_probes_use_the_admin_port, k8s_grace_outlasts_the_drain, k8s_containers_run_unprivileged,
    k8s_secrets_only_by_reference, k8s_containers_have_resources, k8s_workers_fit_the_partitions,
    k8s_keda_watches_the_workers_group, k8s_workers_have_stable_names, k8s_selectors_and_budgets,
    k8s_services_reach_their_listeners, k8s_daily_audit_covers_a_day,
]


def container(ctx, kind, name):
    return template_of(one(ctx, kind, name))["spec"]["containers"][0]


def drop_k8s_env(c, name):
    c["env"] = [e for e in c["env"] if e["name"] != name]


def set_env(c, name, value):
    for e in c["env"]:
        if e["name"] == name:
            e.clear()
            e.update({"name": name, "value": value})
            return
    c["env"].append({"name": name, "value": value})


# (what is broken, the check that must see it, how to break a copy)
KUBERNETES_MUTANTS = [
    ("a probe on the api port", k8s_probes_use_the_admin_port,
     lambda c: container(c, "Deployment", "charged-api")["livenessProbe"]["httpGet"].update(port="http")),
    ("readiness on /healthz", k8s_probes_use_the_admin_port,
     lambda c: container(c, "Deployment", "charged-relay")["readinessProbe"]["httpGet"].update(path="/healthz")),
    ("a grace period shorter than the drain", k8s_grace_outlasts_the_drain,
     lambda c: one(c, "StatefulSet", "charged-worker")["spec"]["template"]["spec"].update(
         terminationGracePeriodSeconds=30)),
    ("a drain longer than the grace period", k8s_grace_outlasts_the_drain,
     lambda c: set_env(container(c, "Deployment", "charged-api"), "SHUTDOWN_TIMEOUT_MS", "40000")),
    ("a literal provider key", k8s_secrets_only_by_reference,
     lambda c: set_env(container(c, "Deployment", "charged-reconciler"), "PROVIDER_API_KEY", "k")),
    ("a secret file outside the secret volume", k8s_secrets_only_by_reference,
     lambda c: set_env(container(c, "Deployment", "charged-relay"), "DATABASE_URL_FILE", "/tmp/db")),
    ("a container that may escalate", k8s_containers_run_unprivileged,
     lambda c: container(c, "Job", "charged-migrate")["securityContext"].update(
         allowPrivilegeEscalation=True)),
    ("a pod that may run as root", k8s_containers_run_unprivileged,
     lambda c: one(c, "Deployment", "charged-api")["spec"]["template"]["spec"]["securityContext"].pop(
         "runAsNonRoot")),
    ("more workers than partitions", k8s_workers_fit_the_partitions,
     lambda c: one(c, "ScaledObject", "charged-worker")["spec"].update(maxReplicaCount=24)),
    ("KEDA on another group", k8s_keda_watches_the_workers_group,
     lambda c: one(c, "ScaledObject", "charged-worker")["spec"]["triggers"][0]["metadata"].update(
         consumerGroup="charged-workers")),
    ("a role without its workload", k8s_every_role_has_its_workload,
     lambda c: c["objects"].remove(next(x for x in c["objects"]
                                        if x[1]["kind"] == "Deployment"
                                        and x[1]["metadata"]["name"] == "charged-relay"))),
    ("an unpinned image", k8s_images_agree,
     lambda c: container(c, "Job", "charged-topics").update(image="apache/kafka:latest")),
    ("a PDB that blocks drains", k8s_selectors_and_budgets,
     lambda c: one(c, "PodDisruptionBudget", "charged-worker")["spec"].update(maxUnavailable=0)),
    ("a worker without a stable id", k8s_workers_have_stable_names,
     lambda c: set_env(container(c, "StatefulSet", "charged-worker"), "KAFKA_GROUP_INSTANCE_ID", "w")),
    ("a namespaced object", k8s_objects_are_well_formed,
     lambda c: one(c, "ConfigMap", "charged-config")["metadata"].update(namespace="payments")),
    ("an auditor without the provider key", k8s_secrets_only_by_reference,
     lambda c: drop_k8s_env(container(c, "Deployment", "charged-auditor"), "PROVIDER_API_KEY_FILE")),
    ("a daily audit of twelve hours", k8s_daily_audit_covers_a_day,
     lambda c: container(c, "CronJob", "charged-audit").update(args=["audit", "run", "--since", "12h"])),
    ("a daily audit retried on its findings", k8s_daily_audit_covers_a_day,
     lambda c: one(c, "CronJob", "charged-audit")["spec"]["jobTemplate"]["spec"].update(backoffLimit=6)),
    ("a console without the provider key", k8s_secrets_only_by_reference,
     lambda c: drop_k8s_env(container(c, "Deployment", "charged-console"), "PROVIDER_API_KEY_FILE")),
    ("a console open to the outside", k8s_services_reach_their_listeners,
     lambda c: one(c, "Service", "charged-console")["spec"].update(type="LoadBalancer")),
    ("a console Service on another port", k8s_services_reach_their_listeners,
     lambda c: set_env(container(c, "Deployment", "charged-console"), "CONSOLE_ADDR", "0.0.0.0:8080")),
    ("a daily audit without its key", k8s_secrets_only_by_reference,
     lambda c: drop_k8s_env(container(c, "CronJob", "charged-audit"), "PROVIDER_API_KEY_FILE")),
]


# --------------------------------------------------------------------------
# docker compose

COMPOSE = os.path.join(DEPLOY, "compose", "compose.yaml")
CHARGED_SERVICES = ("migrate", "psp-sim") + ROLES


def load_compose():
    return {"compose": yaml.safe_load(read(COMPOSE))}


def duration_ms(text):
    """Compose durations: 45s, 1m30s, 500ms."""
    units = {"h": 3600000, "m": 60000, "s": 1000, "ms": 1, "us": 0.001}
    parts = re.findall(r"(\d+(?:\.\d+)?)(ms|us|h|m|s)", str(text))
    check(parts and "".join(n + u for n, u in parts) == str(text), "duration %r" % text)
    return sum(float(n) * units[u] for n, u in parts)


def compose_env(service):
    env = service.get("environment", {})
    if isinstance(env, list):
        env = dict(e.split("=", 1) for e in env)
    return env


def compose_has_the_whole_stack(ctx):
    s = ctx["compose"]["services"]
    for name in ("kafka", "kafka-topics", "postgres") + CHARGED_SERVICES:
        check(name in s, "compose: no service %s" % name)
    check_eq(s["kafka"]["image"], kafka_image(), "compose: Kafka image")
    check_eq(s["kafka-topics"]["image"], kafka_image(), "compose: topics image")
    env = compose_env(s["kafka"])
    check_eq(set(env.get("KAFKA_PROCESS_ROLES", "").split(",")), {"broker", "controller"},
             "compose: Kafka process roles (KRaft, one node)")
    check(not any("ZOOKEEPER" in k for k in env), "compose: Kafka configured for ZooKeeper")
    check(re.fullmatch(r"postgres:16([.-].*)?", s["postgres"]["image"]),
          "compose: PostgreSQL image %r is not 16" % s["postgres"]["image"])
    for role in ROLES:
        check_eq(s[role].get("command"), [role], "compose: command of %s" % role)
    check_eq((s["migrate"].get("entrypoint"), s["migrate"].get("command")),
             (["chargectl"], ["migrate"]), "compose: the migration one-shot")
    script = psp_sim_script(s["psp-sim"])
    check(re.search(r"^exec psp-sim .*--host 0\.0\.0\.0", script, re.M),
          "compose: psp-sim does not run as the shell's last command on every interface")
    check("--webhook-url http://api:8080/v1/webhooks/provider" in script,
          "compose: psp-sim does not send its webhooks to the api")
    check("--webhook-secret" not in script,
          "compose: psp-sim's webhook secret is on its command line")


def psp_sim_script(service):
    """The shell script psp-sim's service runs (entrypoint sh -ec)."""
    check_eq(service.get("entrypoint"), ["/bin/sh", "-ec"], "compose: psp-sim's entrypoint")
    check(isinstance(service.get("command"), list) and len(service["command"]) == 1,
          "compose: psp-sim's command is not one script")
    return service["command"][0]


def compose_images_agree(ctx):
    s = ctx["compose"]["services"]
    images = {(s[n].get("image"), json.dumps(s[n].get("build"), sort_keys=True))
              for n in CHARGED_SERVICES + ("chargectl",)}
    check_eq(len(images), 1, "compose: distinct image/build pairs of the charged services")
    build = s["worker"]["build"]
    ctxdir = os.path.normpath(os.path.join(os.path.dirname(COMPOSE), build["context"]))
    check_eq(ctxdir, os.path.normpath(ROOT), "compose: build context (the repository root)")
    check(os.path.isfile(os.path.join(ctxdir, build["dockerfile"])),
          "compose: Dockerfile %s does not exist" % build["dockerfile"])


def depends(service, on):
    d = service.get("depends_on", {})
    return d.get(on, {}).get("condition") if isinstance(d, dict) else None


def compose_starts_in_order(ctx):
    s = ctx["compose"]["services"]
    check_eq(depends(s["migrate"], "postgres"), "service_healthy", "compose: migrate waits for")
    check_eq(depends(s["kafka-topics"], "kafka"), "service_healthy", "compose: topics wait for")
    for role in ROLES:
        check_eq(depends(s[role], "migrate"), "service_completed_successfully",
                 "compose: %s waits for the migrations" % role)
    for role in ("worker", "relay"):
        check_eq(depends(s[role], "kafka-topics"), "service_completed_successfully",
                 "compose: %s waits for the topics" % role)
    for role in ("worker", "reconciler", "auditor"):
        check_eq(depends(s[role], "psp-sim"), "service_healthy",
                 "compose: %s waits for the provider" % role)
    for name in ("migrate", "kafka-topics"):
        check_eq(s[name].get("restart"), "no", "compose: restart of the one-shot %s" % name)
    for name in ("kafka", "postgres", "psp-sim") + ROLES:
        check("healthcheck" in s[name], "compose: %s has no healthcheck" % name)


def compose_healthchecks_ask_healthz(ctx):
    s = ctx["compose"]["services"]
    for role in ROLES:
        env = compose_env(s[role])
        addr = env.get("ADMIN_ADDR", "")
        check_eq(addr, "0.0.0.0:%d" % ADMIN_PORT, "compose: ADMIN_ADDR of %s" % role)
        test = s[role]["healthcheck"]["test"]
        check(isinstance(test, list) and test[0] == "CMD",
              "compose: healthcheck of %s is not an exec form" % role)
        check("http://127.0.0.1:%d/healthz" % ADMIN_PORT in test,
              "compose: healthcheck of %s does not ask /healthz on the admin port: %s" % (role, test))


def compose_grace_outlasts_the_drain(ctx):
    s = ctx["compose"]["services"]
    for role in ROLES:
        env = compose_env(s[role])
        check("SHUTDOWN_TIMEOUT_MS" in env, "compose: %s sets no SHUTDOWN_TIMEOUT_MS" % role)
        grace = duration_ms(s[role].get("stop_grace_period", "10s"))
        check(grace >= int(env["SHUTDOWN_TIMEOUT_MS"]) + GRACE_MARGIN_MS,
              "compose: stop_grace_period of %s (%d ms) does not outlast SHUTDOWN_TIMEOUT_MS %s" % (
                  role, grace, env["SHUTDOWN_TIMEOUT_MS"]))


def compose_secrets_are_files(ctx):
    c = ctx["compose"]
    top = c.get("secrets", {})
    for name, spec in top.items():
        check(set(spec) == {"file"}, "compose: secret %s is not a file" % name)
        check(os.path.isfile(os.path.join(os.path.dirname(COMPOSE), spec["file"])),
              "compose: secret file %s is missing" % spec["file"])
    for name, svc in c["services"].items():
        env = compose_env(svc)
        mine = set(svc.get("secrets", []))
        for k, v in env.items():
            secret = k in SECRET_VARS or k == "POSTGRES_PASSWORD"
            check(not secret, "compose: %s gets %s as a value, not a file" % (name, k))
            check(not looks_secret(str(v)), "compose: %s: %s looks like a secret" % (name, k))
            if k.endswith("_FILE"):
                m = re.fullmatch(r"/run/secrets/([\w-]+)", str(v))
                check(m and m.group(1) in mine and m.group(1) in top,
                      "compose: %s: %s=%s is not one of its secrets" % (name, k, v))
    for role in ROLES:
        env = compose_env(c["services"][role])
        got = {k[:-5] for k in env if k.endswith("_FILE")}
        check_eq(got, SECRETS_READ[role], "compose: secrets given to %s" % role)


def compose_workers_fit_the_partitions(ctx):
    replicas = ctx["compose"]["services"]["worker"].get("deploy", {}).get("replicas")
    check_eq(replicas, 2, "compose: worker replicas")
    p = compose_partitions()
    check(replicas <= p, "compose: %d workers for %d partitions" % (replicas, p))
    cmd = "\n".join(ctx["compose"]["services"]["kafka-topics"]["command"])
    for topic in (COMMANDS_TOPIC, "payments.charge.results", "payments.charge.commands.dlq"):
        partitions_in(cmd, topic)


COMPOSE_CHECKS = [
    compose_has_the_whole_stack, compose_images_agree, compose_starts_in_order,
    compose_healthchecks_ask_healthz, compose_grace_outlasts_the_drain, compose_secrets_are_files,
    compose_workers_fit_the_partitions,
]
COMPOSE_MUTANTS = [
    ("a role that does not wait for the migrations", compose_starts_in_order,
     lambda c: c["compose"]["services"]["relay"]["depends_on"].pop("migrate")),
    ("a migration merely started", compose_starts_in_order,
     lambda c: c["compose"]["services"]["api"]["depends_on"]["migrate"].update(
         condition="service_started")),
    ("a healthcheck on the api port", compose_healthchecks_ask_healthz,
     lambda c: c["compose"]["services"]["api"]["healthcheck"].update(
         test=["CMD", "curl", "-f", "http://127.0.0.1:8080/healthz"])),
    ("the default stop grace period", compose_grace_outlasts_the_drain,
     lambda c: c["compose"]["services"]["worker"].pop("stop_grace_period")),
    ("an auditor that does not wait for the provider", compose_starts_in_order,
     lambda c: c["compose"]["services"]["auditor"]["depends_on"].pop("psp-sim")),
    ("a literal database URL", compose_secrets_are_files,
     lambda c: c["compose"]["services"]["relay"]["environment"].update(
         DATABASE_URL="postgresql://charged:pw@postgres/charged")),
    ("three workers", compose_workers_fit_the_partitions,
     lambda c: c["compose"]["services"]["worker"]["deploy"].update(replicas=3)),
    ("another Kafka", compose_has_the_whole_stack,
     lambda c: c["compose"]["services"]["kafka"].update(image="apache/kafka:3.7.0")),
]


# --------------------------------------------------------------------------
# The image

DOCKERFILE = os.path.join(DEPLOY, "docker", "Dockerfile")


def parse_dockerfile(text):
    """[(stage index, INSTRUCTION, arguments)], continuation lines joined."""
    out, stage, buf = [], -1, ""
    for line in text.splitlines():
        if not buf and (not line.strip() or line.lstrip().startswith("#")):
            continue
        if buf and line.lstrip().startswith("#"):
            continue
        if line.rstrip().endswith("\\"):
            buf += line.rstrip()[:-1] + " "
            continue
        full = (buf + line).strip()
        buf = ""
        instr, _, args = full.partition(" ")
        instr = instr.upper()
        if instr == "FROM":
            stage += 1
        out.append((stage, instr, args.strip()))
    return out


def load_image():
    return {"dockerfile": parse_dockerfile(read(DOCKERFILE)),
            "ignore": read(DOCKERFILE + ".dockerignore")}


def stages(ctx):
    froms = [a for _, i, a in ctx["dockerfile"] if i == "FROM"]
    return froms


def stage_of(ctx, n):
    return [(i, a) for s, i, a in ctx["dockerfile"] if s == n]


def apt_packages(instrs):
    pkgs = set()
    for i, a in instrs:
        if i == "RUN":
            for m in re.finditer(r"apt-get install ([^&;|]*)", a):
                pkgs |= {w for w in m.group(1).split() if not w.startswith("-")}
    return pkgs


def image_is_multi_stage(ctx):
    froms = stages(ctx)
    check(len(froms) >= 2, "the Dockerfile has %d stage(s)" % len(froms))
    check(re.fullmatch(r"debian:(bookworm|\$\{DEBIAN_RELEASE\}) AS build", froms[0]),
          "first stage %r is not a Debian bookworm build stage" % froms[0])
    check(re.match(r"debian:(bookworm|\$\{DEBIAN_RELEASE\})-slim( AS \w+)?$", froms[-1]),
          "final stage %r is not bookworm-slim" % froms[-1])
    args = [a for s, i, a in ctx["dockerfile"] if i == "ARG" and s == -1]
    for a in args:
        if a.startswith("DEBIAN_RELEASE="):
            check_eq(a, "DEBIAN_RELEASE=bookworm", "the Debian release")


def image_runs_as_non_root(ctx):
    last = len(stages(ctx)) - 1
    users = [a for i, a in stage_of(ctx, last) if i == "USER"]
    check(users, "the final stage sets no USER: it runs as root")
    uid = users[-1].split(":")[0]
    check(uid.isdigit() and int(uid) > 0,
          "final USER %r is not a numeric non-root uid (runAsNonRoot needs a number)" % users[-1])
    check_eq(int(uid), 10001, "the image's uid (the manifests' runAsUser)")


def image_holds_no_secret(ctx):
    for s, i, a in ctx["dockerfile"]:
        if i in ("ENV", "ARG", "LABEL"):
            check(not re.search(r"PASSWORD|SECRET|API_KEY|TOKEN|DATABASE_URL|PRIVATE", a, re.I),
                  "%s %s: a secret in the image" % (i, a))
            check(not looks_secret(a), "%s %s: a secret in the image" % (i, a))
        if i in ("COPY", "ADD"):
            check(not re.search(r"secret|\.pem|\.key|\.env\b|id_rsa", a, re.I),
                  "%s %s: copies something secret-looking" % (i, a))
    ignore = [l.strip() for l in ctx["ignore"].splitlines() if l.strip() and not l.startswith("#")]
    check_eq(ignore[0], "*", "the .dockerignore's first rule (an allow-list starts with *)")
    for allowed in ignore[1:]:
        check(allowed.startswith("!"), ".dockerignore rule %r" % allowed)
        # The build trees are build*/ at the top (deploy/librdkafka/build.sh
        # is a source).
        check(not re.search(r"secret|compose|\.git|\.stack", allowed) and
              not allowed[1:].lstrip("/").startswith("build"),
              ".dockerignore lets %s into the build context" % allowed)


def image_builds_from_the_sources(ctx):
    ignore = [l.strip()[1:] for l in ctx["ignore"].splitlines() if l.strip().startswith("!")]
    for s, i, a in ctx["dockerfile"]:
        if i != "COPY" or a.startswith("--from"):
            continue
        srcs = shlex.split(a)[:-1]
        for src in srcs:
            check(os.path.exists(os.path.join(ROOT, src)), "COPY %s: no such path" % src)
            check(any(src.rstrip("/") == x.rstrip("/") or src.startswith(x) for x in ignore),
                  "COPY %s: not in the build context (Dockerfile.dockerignore)" % src)
    # What CMake reads must be in the image's build: every directory the
    # top level adds and every file a CMakeLists.txt names by its source
    # path (say, tools/embed_files.cmake).
    copied = [shlex.split(a)[0].rstrip("/") for s, i, a in ctx["dockerfile"]
              if s == 0 and i == "COPY" and not a.startswith("--from")]
    covered = lambda path: any(path == c or path.startswith(c + "/") for c in copied)
    top = read(os.path.join(ROOT, "CMakeLists.txt"))
    # The fuzz tree (tools/fuzz.sh's, CHARGED_FUZZ) is never the image's:
    # what only it adds need not be copied, as long as the image leaves it off.
    check("CHARGED_FUZZ" not in read(os.path.join(DEPLOY, "docker", "Dockerfile")),
          "the image's build sets CHARGED_FUZZ")
    top = re.sub(r"(?ms)^if\(CHARGED_FUZZ\)$.*?^endif\(\)$", "", top)
    for d in re.findall(r"add_subdirectory\(\s*([^\s)]+)", top):
        check(covered(d) or (d == "tests" and covered("tests/CMakeLists.txt")),
              "CMakeLists.txt adds %s, which the build stage does not copy" % d)
    for cm in glob.glob(os.path.join(ROOT, "**", "CMakeLists.txt"), recursive=True):
        r = rel(cm)
        if not covered(r) or r.startswith("tests/"):
            continue
        for ref in re.findall(r"\$\{CMAKE_SOURCE_DIR\}/([\w./-]+)", read(cm)):
            check(covered(ref.rstrip("/")), "%s names %s, which the build stage does not copy" % (r, ref))
    build = apt_packages(stage_of(ctx, 0))
    deps = read(os.path.join(DEPLOY, "install-deps.sh"))
    listed = set(re.search(r"packages=\(([^)]*)\)", deps).group(1).split())
    for p in listed:
        if p.endswith("-dev"):
            check(p in build, "the build stage lacks %s (deploy/install-deps.sh has it)" % p)
    run = " ".join(a for i, a in stage_of(ctx, 0) if i == "RUN")
    for target in ("charged", "chargectl", "psp-sim"):
        check(re.search(r"--target [^&]*\b%s\b" % re.escape(target), run),
              "the build stage does not build %s" % target)
    # librdkafka: deploy/librdkafka/build.sh's, into the prefix CMake looks
    # in, before the build of charged; never Debian's packages.
    check(not build & NOT_IN_IMAGE, "the build stage installs %s" % sorted(build & NOT_IN_IMAGE))
    prefix = re.search(r'set\(CHARGED_RDKAFKA_PREFIX "([^"]+)"', top).group(1)
    steps = [a for i, a in stage_of(ctx, 0) if i == "RUN"]
    built = [n for n, a in enumerate(steps) if re.search(r"deploy/librdkafka/build\.sh( %s)?(\s|$)"
                                                       % re.escape(prefix), a)]
    check(built, "the build stage does not run deploy/librdkafka/build.sh (into %s)" % prefix)
    check(built[0] < min(n for n, a in enumerate(steps) if "cmake -S" in a),
          "the build stage runs cmake before deploy/librdkafka/build.sh")


def image_ships_binaries_and_migrations(ctx):
    last = len(stages(ctx)) - 1
    instrs = stage_of(ctx, last)
    copies = [a for i, a in instrs if i == "COPY"]
    for path, binary in (("worker/charged", "charged"), ("worker/chargectl/chargectl", "chargectl"),
                         ("tools/psp-sim/psp-sim", "psp-sim")):
        check(any(a.startswith("--from=build") and "/build/%s " % path in a + " " and
                  a.endswith("/usr/local/bin/" + binary) for a in copies),
              "the final stage does not install %s" % binary)
    check(any(a.startswith("--from=build") and "migrations" in a for a in copies),
          "the final stage has no migrations")
    check_eq([a for i, a in instrs if i == "ENTRYPOINT"][-1:], ['["charged"]'], "ENTRYPOINT")
    runtime = apt_packages(instrs)
    check(not [p for p in runtime if p.endswith("-dev") or p in ("build-essential", "cmake", "gcc")],
          "the runtime stage installs build tools: %s" % sorted(runtime))


def needed_packages(binary):
    """{soname: owner} of the shared libraries binary loads directly, found
    as the loader finds them: in its RUNPATH first (owner: "/path/of/the/file",
    a library no Debian package ships, such as the librdkafka built into
    /opt/charged/librdkafka), then in ld.so's cache (owner: the Debian
    package of the file). Sanitizer runtimes (build-asan) are not part of
    any image."""
    out = subprocess.run(["readelf", "-d", binary], capture_output=True, text=True, check=True).stdout
    sonames = re.findall(r"\(NEEDED\)\s+Shared library: \[([^\]]+)\]", out)
    m = re.search(r"\((?:RUNPATH|RPATH)\)\s+Library r(?:un)?path: \[([^\]]*)\]", out)
    origin = os.path.dirname(os.path.abspath(binary))
    runpath = [d.replace("$ORIGIN", origin) for d in m.group(1).split(":")] if m else []
    cache = subprocess.run(["ldconfig", "-p"], capture_output=True, text=True, check=True).stdout
    pkgs = {}
    for so in sonames:
        if re.match(r"lib(asan|ubsan|lsan|tsan)\.", so):
            continue
        found = [os.path.join(d, so) for d in runpath if os.path.exists(os.path.join(d, so))]
        if found:
            pkgs[so] = found[0]
            continue
        m = re.search(r"^\s*%s \([^)]*x86-64[^)]*\) => (\S+)" % re.escape(so), cache, re.M) or \
            re.search(r"^\s*%s \([^)]*\) => (\S+)" % re.escape(so), cache, re.M)
        check(m, "%s: %s not found by ldconfig" % (binary, so))
        owner = None
        for path in {m.group(1), os.path.realpath(m.group(1)), "/usr" + m.group(1)}:
            r = subprocess.run(["dpkg", "-S", path], capture_output=True, text=True)
            if r.returncode == 0:
                owner = r.stdout.split(":")[0]
                break
        check(owner, "%s: no Debian package owns %s" % (binary, so))
        pkgs[so] = owner
    return pkgs


# Debian packages the image must not hold: bookworm's librdkafka1 is 2.0.2,
# which Kafka 4.x does not speak to (deploy/librdkafka/build.sh).
NOT_IN_IMAGE = {"librdkafka1", "librdkafka-dev"}


def copied_from_build(instrs, path):
    """Whether a COPY --from=build of the stage puts the build stage's file
    at path at that same path (the binaries' RUNPATH names it)."""
    import fnmatch
    for i, a in instrs:
        if i != "COPY" or not a.startswith("--from=build"):
            continue
        words = shlex.split(a)[1:]
        srcs, dest = words[:-1], words[-1]
        into = dest.rstrip("/") if dest.endswith("/") or len(srcs) > 1 else os.path.dirname(dest)
        if into != os.path.dirname(path):
            continue
        if any(os.path.dirname(src) == os.path.dirname(path) and
               fnmatch.fnmatch(os.path.basename(path), os.path.basename(src)) for src in srcs):
            return True
    return False


def image_has_every_runtime_library(ctx):
    build = os.environ.get("CHARGED_BUILD_DIR") or os.path.join(ROOT, "build")
    last = len(stages(ctx)) - 1
    runtime = apt_packages(stage_of(ctx, last))
    base = {"libc6", "libgcc-s1", "zlib1g"}  # in debian:bookworm-slim already
    check(not runtime & NOT_IN_IMAGE, "the runtime stage installs %s" % sorted(runtime & NOT_IN_IMAGE))
    todo = [os.path.join(build, b)
            for b in ("worker/charged", "worker/chargectl/chargectl", "tools/psp-sim/psp-sim")]
    seen = set()
    while todo:
        path = todo.pop()
        if path in seen:
            continue
        seen.add(path)
        check(os.path.isfile(path), "%s is not built (the check reads its libraries)" % path)
        b = rel(path) if path.startswith(build) else path
        for so, owner in needed_packages(path).items():
            check(owner not in NOT_IN_IMAGE,
                  "%s loads %s from Debian's %s: that build is not linked against the librdkafka "
                  "of deploy/librdkafka/build.sh" % (b, so, owner))
            if owner.startswith("/"):
                # Not a package's: the runtime stage copies it from the
                # build stage to the same path, and what it loads counts.
                check(copied_from_build(stage_of(ctx, last), owner),
                      "%s loads %s from %s, which the runtime stage does not copy there"
                      % (b, so, owner))
                todo.append(owner)
                continue
            check(owner in runtime or owner in base,
                  "%s loads %s from %s, which the runtime stage does not install" % (b, so, owner))


IMAGE_CHECKS = [
    image_is_multi_stage, image_runs_as_non_root, image_holds_no_secret,
    image_builds_from_the_sources, image_ships_binaries_and_migrations,
    image_has_every_runtime_library,
]


def drop_instr(c, instr):
    last = last_stage(c)
    c["dockerfile"] = [x for x in c["dockerfile"] if not (x[0] == last and x[1] == instr)]


def add_instr(c, stage, instr, args):
    c["dockerfile"].append((stage, instr, args))


def last_stage(c):
    return max(s for s, _, _ in c["dockerfile"])


IMAGE_MUTANTS = [
    ("no USER", image_runs_as_non_root, lambda c: drop_instr(c, "USER")),
    ("USER root last", image_runs_as_non_root,
     lambda c: add_instr(c, last_stage(c), "USER", "root")),
    ("a baked-in key", image_holds_no_secret,
     lambda c: add_instr(c, last_stage(c), "ENV", "PROVIDER_API_KEY=sk_live_x")),
    ("the dev secrets copied", image_holds_no_secret,
     lambda c: add_instr(c, last_stage(c), "COPY", "deploy/compose/dev-secrets/ /run/secrets/")),
    ("one stage", image_is_multi_stage,
     lambda c: c.update(dockerfile=[x for x in c["dockerfile"] if x[0] <= 0])),
    ("a runtime library missing", image_has_every_runtime_library,
     lambda c: c.update(dockerfile=[(s, i, a.replace("libpq5", "")) for s, i, a in c["dockerfile"]])),
    ("no psp-sim", image_ships_binaries_and_migrations,
     lambda c: c.update(dockerfile=[x for x in c["dockerfile"] if "psp-sim/psp-sim" not in x[2]])),
    ("the file embedder left out", image_builds_from_the_sources,
     lambda c: c.update(dockerfile=[x for x in c["dockerfile"] if "embed_files" not in x[2]])),
    ("a -dev package missing from the build", image_builds_from_the_sources,
     lambda c: c.update(dockerfile=[(s, i, a.replace("libmicrohttpd-dev", "")) for s, i, a in c["dockerfile"]])),
    ("bookworm's librdkafka-dev instead of build.sh", image_builds_from_the_sources,
     lambda c: c.update(dockerfile=[(s, i, a.replace("deploy/librdkafka/build.sh /", "true /")
                                     .replace("dpkg-dev", "dpkg-dev librdkafka-dev"))
                                    for s, i, a in c["dockerfile"]])),
    ("bookworm's librdkafka1 instead of the built one", image_has_every_runtime_library,
     lambda c: c.update(dockerfile=[(s, i, a.replace("libpq5", "libpq5 librdkafka1"))
                                    for s, i, a in c["dockerfile"] if "librdkafka.so" not in a])),
    ("the built librdkafka not copied", image_has_every_runtime_library,
     lambda c: c.update(dockerfile=[x for x in c["dockerfile"] if "librdkafka.so" not in x[2]])),
    ("a build tree in the build context", image_holds_no_secret,
     lambda c: c.update(ignore=c["ignore"] + "\n!build-asan/\n")),
]


# --------------------------------------------------------------------------
# Alerts, dashboard, scrape configs, runbook

PROM = os.path.join(DEPLOY, "prometheus")
DASHBOARD = os.path.join(DEPLOY, "grafana", "charged-dashboard.json")
OPERATIONS = os.path.join(ROOT, "docs", "operations.md")


def known_metrics():
    """(names, where from). common/runtime/metrics.c's table, once it exists, is the
    truth about what the programs export; until then the agreed list."""
    src = os.path.join(ROOT, "common", "runtime", "metrics.c")
    if os.path.exists(src):
        names = set(re.findall(r'"(charged_[a-z0-9_]+)"', read(src)))
        check(names, "common/runtime/metrics.c names no charged_ metric")
        return names, "common/runtime/metrics.c"
    return set(METRICS), "the list in this test"


def load_observability():
    names, source = known_metrics()
    return {
        "rules": yaml.safe_load(read(os.path.join(PROM, "charged.rules.yml"))),
        "rule_tests": yaml.safe_load(read(os.path.join(PROM, "charged.rules.test.yml"))),
        "prometheus": yaml.safe_load(read(os.path.join(PROM, "prometheus.example.yml"))),
        "scrape_k8s": yaml.safe_load(read(os.path.join(PROM, "scrape-kubernetes.example.yml"))),
        "dashboard": json.loads(read(DASHBOARD)),
        "operations": read(OPERATIONS),
        "known": names, "source": source,
    }


def metric_uses(expr):
    """(name, {label matchers}) of every charged_ series selector in expr."""
    uses = []
    for m in re.finditer(r"\b(charged_[a-z0-9_]+)(\{([^}]*)\})?", expr):
        labels = set(re.findall(r"([a-zA-Z_]\w*)\s*(?:=~|!~|!=|=)", m.group(3) or ""))
        uses.append((m.group(1), labels))
    return uses


def base_family(name, known):
    if name in known:
        return name
    for suffix in ("_bucket", "_sum", "_count"):
        base = name[: -len(suffix)] if name.endswith(suffix) else None
        if base and base in known and METRICS.get(base, ("histogram",))[0] == "histogram":
            return base
    return None


def check_expr(where, expr, known):
    uses = metric_uses(expr)
    for name, labels in uses:
        fam = base_family(name, known)
        check(fam, "%s: %s is no metric charged exports" % (where, name))
        spec = METRICS.get(fam) or ALERT_METRICS.get(fam)
        if spec:
            allowed = spec[1] | TARGET_LABELS
            check(labels <= allowed, "%s: %s has no label %s" % (where, name, sorted(labels - allowed)))
    return {base_family(n, known) for n, _ in uses}


def alerts(ctx):
    return [r for g in ctx["rules"]["groups"] for r in g["rules"] if "alert" in r]


def slug(heading):
    """The anchor a Markdown heading gets."""
    s = heading.strip().lower()
    s = re.sub(r"[^\w\- ]", "", s)
    return s.replace(" ", "-")


def obs_alerts_use_known_metrics(ctx):
    for a in alerts(ctx):
        check_expr("alert %s" % a["alert"], a["expr"], ctx["known"])


def obs_alerts_cover_the_issue(ctx):
    exprs = {a["alert"]: a["expr"] for a in alerts(ctx)}
    want = [
        ("UNKNOWN attempts' age", r'charged_reconciler_oldest_attempt_age_seconds\{status="UNKNOWN"\}'),
        ("dead-letter rate", r"rate\(charged_dead_letters_total"),
        ("outbox age", r"charged_outbox_oldest_event_age_seconds"),
        ("consumer lag", r"charged_consumer_lag_messages"),
        # open (== 2), or not closed (>= 1) while it opened recently
        ("breaker open",
         r"charged_provider_breaker_state(\[[^\]]*\])?\)*\s*(==\s*2|>=\s*1)"),
        ("audit watermark's age", r"charged_audit_watermark_age_seconds"),
        ("auditor's absence", r'absent\(charged_ready\{role="auditor"\}\)'),
    ]
    for what, pattern in want:
        check(any(re.search(pattern, e) for e in exprs.values()), "no alert on the %s" % what)


def audit_kinds():
    """The finding kinds, as common/core/audit_policy.c names them."""
    text = read(os.path.join(ROOT, "common", "core", "audit_policy.c"))
    kinds = re.findall(r'\[AUDIT_[A-Z_]+\] = "([a-z_]+)"', text)
    check(len(kinds) >= 8, "common/core/audit_policy.c names %d finding kinds" % len(kinds))
    return kinds


def kind_selected(matcher, kind):
    """Whether a PromQL label matcher (op, value) on kind selects kind."""
    op, value = matcher
    if op in ("=", "!="):
        return (kind == value) == (op == "=")
    return bool(re.fullmatch(value, kind)) == (op == "=~")


def obs_audit_findings_page_and_ticket(ctx):
    """Every finding kind alerts: charged_twice and charged_unbooked page
    (money taken that the books do not account for), every other kind opens
    a ticket and none pages; an alert on the counter says which kind it
    selects, on every selector of its expression."""
    page, ticket = {}, {}
    for a in alerts(ctx):
        uses = [m.group(1) for m in re.finditer(r"charged_audit_findings_total(\{[^}]*\})?", a["expr"])]
        if not uses:
            continue
        matchers = set()
        for labels in uses:
            found = re.findall(r'kind\s*(=~|!~|!=|=)\s*"([^"]*)"', labels or "")
            check(len(found) == 1, "alert %s: a selector of the findings counter without one "
                  "kind matcher: %s" % (a["alert"], labels))
            matchers.add(found[0])
        check_eq(len(matchers), 1, "kind matchers of alert %s" % a["alert"])
        matcher = matchers.pop()
        sev = a.get("labels", {}).get("severity")
        for kind in audit_kinds():
            if kind_selected(matcher, kind):
                (page if sev == "page" else ticket).setdefault(kind, []).append(a["alert"])
    for kind in audit_kinds():
        if kind in ("charged_twice", "charged_unbooked"):
            check(kind in page, "no alert pages on %s findings" % kind)
        else:
            check(kind in ticket, "no alert opens a ticket on %s findings" % kind)
            check(kind not in page, "%s findings page (%s): a ticket is enough" % (kind, page.get(kind)))


def obs_alerts_have_a_runbook(ctx):
    headings = {slug(h) for h in re.findall(r"^#{2,4} (.+)$", ctx["operations"], re.M)}
    names = [a["alert"] for a in alerts(ctx)]
    check_eq(len(names), len(set(names)), "distinct alert names")
    for a in alerts(ctx):
        n = a["alert"]
        check(a.get("labels", {}).get("severity") in ("page", "ticket"),
              "alert %s: severity %r" % (n, a.get("labels", {}).get("severity")))
        ann = a.get("annotations", {})
        for k in ("summary", "description", "runbook"):
            check(ann.get(k), "alert %s has no %s" % (n, k))
        path, _, anchor = ann["runbook"].partition("#")
        check_eq(path, "docs/operations.md", "alert %s: runbook page" % n)
        check(anchor in headings, "alert %s: docs/operations.md has no section #%s" % (n, anchor))


def obs_every_alert_is_unit_tested_both_ways(ctx):
    fired, quiet = set(), set()
    for t in ctx["rule_tests"]["tests"]:
        for a in t.get("alert_rule_test", []):
            (fired if a.get("exp_alerts") else quiet).add(a["alertname"])
    for a in alerts(ctx):
        check(a["alert"] in fired, "no unit test shows %s firing" % a["alert"])
        check(a["alert"] in quiet, "no unit test shows %s quiet" % a["alert"])
    check_eq(ctx["rule_tests"]["rule_files"], ["charged.rules.yml"], "rule files under test")


def dashboard_panels(ctx):
    out = []
    for p in ctx["dashboard"]["panels"]:
        out.append(p)
        out.extend(p.get("panels", []))
    return out


def obs_dashboard_uses_known_metrics(ctx):
    d = ctx["dashboard"]
    check(d.get("title") and d.get("uid") and d.get("schemaVersion"), "dashboard header")
    ids = [p["id"] for p in dashboard_panels(ctx)]
    check_eq(len(ids), len(set(ids)), "distinct panel ids")
    used = set()
    for p in dashboard_panels(ctx):
        check("gridPos" in p, "panel %s has no gridPos" % p.get("title"))
        if p["type"] == "row":
            continue
        check(p.get("targets"), "panel %s has no query" % p.get("title"))
        check_eq(p.get("datasource", {}).get("uid"), "${datasource}",
                 "panel %s: datasource (the dashboard's variable)" % p["title"])
        for t in p["targets"]:
            used |= check_expr("panel %s" % p["title"], t["expr"], ctx["known"])
    missing = sorted(set(METRICS) & ctx["known"] - used)
    check(not missing, "no dashboard panel shows %s" % missing)
    check([v for v in d["templating"]["list"] if v["name"] == "datasource" and v["type"] == "datasource"],
          "the dashboard has no datasource variable")


def obs_known_list_matches_the_programs(ctx):
    # With common/runtime/metrics.c present, every family the dashboard and the
    # alerts were written for must be one it exports.
    if ctx["source"] == "common/runtime/metrics.c":
        missing = sorted((set(METRICS) | set(ALERT_METRICS)) - ctx["known"])
        check(not missing, "common/runtime/metrics.c does not export %s" % missing)


def obs_scrape_configs_label_the_role(ctx):
    p = ctx["prometheus"]
    check_eq(p["rule_files"], ["charged.rules.yml"], "prometheus.example.yml rule_files")
    jobs = p["scrape_configs"] + ctx["scrape_k8s"]["scrape_configs"]
    for j in jobs:
        targets = [r.get("target_label") for r in j.get("relabel_configs", [])]
        check("role" in targets, "scrape job %s sets no role label (the alerts need it)" % j["job_name"])
    dns = p["scrape_configs"][0]["dns_sd_configs"][0]
    check_eq((sorted(dns["names"]), dns["port"]), (sorted(ROLES), ADMIN_PORT),
             "compose scrape job: services and port")
    keep = [r for r in ctx["scrape_k8s"]["scrape_configs"][0]["relabel_configs"] if r.get("action") == "keep"]
    check(keep and keep[0]["regex"] == "charged;admin" and
          keep[0]["source_labels"][-1] == "__meta_kubernetes_pod_container_port_name",
          "the Kubernetes scrape job does not keep only the ports named admin")


def obs_install_deps_installs_the_tools(ctx):
    deps = read(os.path.join(DEPLOY, "install-deps.sh"))
    listed = set(re.search(r"packages=\(([^)]*)\)", deps).group(1).split())
    for p in ("python3-yaml", "prometheus"):
        check(p in listed, "deploy/install-deps.sh does not install %s" % p)


OBSERVABILITY_CHECKS = [
    obs_alerts_use_known_metrics, obs_alerts_cover_the_issue, obs_audit_findings_page_and_ticket,
    obs_alerts_have_a_runbook,
    obs_every_alert_is_unit_tested_both_ways, obs_dashboard_uses_known_metrics,
    obs_known_list_matches_the_programs, obs_scrape_configs_label_the_role,
    obs_install_deps_installs_the_tools,
]


def alert_named(c, name):
    return next(a for a in alerts(c) if a["alert"] == name)


def first_panel_with(c, family):
    return next(p for p in dashboard_panels(c) if any(family in t["expr"] for t in p.get("targets", [])))


OBSERVABILITY_MUTANTS = [
    ("an alert on a metric nobody exports", obs_alerts_use_known_metrics,
     lambda c: alerts(c)[0].update(expr="charged_reconciler_oldest_unknown_seconds > 900")),
    ("a label the metric does not have", obs_alerts_use_known_metrics,
     lambda c: alerts(c)[0].update(expr='charged_outbox_backlog_events{status="UNKNOWN"} > 1')),
    ("a panel on a misspelt metric", obs_dashboard_uses_known_metrics,
     lambda c: first_panel_with(c, "charged_ready")["targets"][0].update(expr="min(charged_readyz)")),
    ("a family no panel shows", obs_dashboard_uses_known_metrics,
     lambda c: c["dashboard"].update(panels=[p for p in c["dashboard"]["panels"]
                                             if "charged_webhook_deliveries_total" not in json.dumps(p)])),
    ("a runbook link to no section", obs_alerts_have_a_runbook,
     lambda c: alerts(c)[0]["annotations"].update(runbook="docs/operations.md#nothing-here")),
    ("an alert never tested firing", obs_every_alert_is_unit_tested_both_ways,
     lambda c: [a.update(exp_alerts=[]) for t in c["rule_tests"]["tests"]
                for a in t.get("alert_rule_test", []) if a["alertname"] == "ChargedOutboxStalled"]),
    ("a kind the findings counter does not have", obs_alerts_use_known_metrics,
     lambda c: alert_named(c, "ChargedAuditChargedTwice").update(
         expr='sum(increase(charged_audit_findings_total{kinds="charged_twice"}[1h])) > 0')),
    ("a double charge that only opens a ticket", obs_audit_findings_page_and_ticket,
     lambda c: alert_named(c, "ChargedAuditChargedTwice")["labels"].update(severity="ticket")),
    ("charged_unbooked left out of every alert", obs_audit_findings_page_and_ticket,
     lambda c: c["rules"]["groups"].__setitem__(slice(None), [
         dict(g, rules=[r for r in g["rules"] if r.get("alert") != "ChargedAuditChargedUnbooked"])
         for g in c["rules"]["groups"]])),
    ("amount mismatches that page", obs_audit_findings_page_and_ticket,
     lambda c: alert_named(c, "ChargedAuditFindings")["labels"].update(severity="page")),
    ("no alert on the auditor's absence", obs_alerts_cover_the_issue,
     lambda c: alert_named(c, "ChargedAuditorMissing").update(
         expr="absent(charged_audit_watermark_age_seconds)")),
    ("no breaker alert", obs_alerts_cover_the_issue,
     lambda c: [g.update(rules=[r for r in g["rules"] if "breaker_state" not in r["expr"]])
                for g in c["rules"]["groups"]]),
]


# --------------------------------------------------------------------------
# Settings: the programs themselves accept what the files give them

# Each role, chargectl migrate and psp-sim are started with the environment
# a Kubernetes pod or a compose service gives them, and must get past their
# configuration (a bad or missing variable exits 2 before anything else).
# Only what cannot work here is replaced: every address that would reach
# another machine (Kafka, PostgreSQL, the provider, their .invalid or
# compose host names) points at a closed port on loopback, listeners get
# free loopback ports, and secret files are written to a temporary
# directory (compose's development secrets are used as they are, with the
# database URL's host moved to loopback).

BUILD = os.environ.get("CHARGED_BUILD_DIR") or os.path.join(ROOT, "build")
CLOSED = "127.0.0.1:1"  # nothing listens on port 1: connections are refused
STARTED = {role: '"msg":"%s started"' % role for role in ROLES}
DUMMY_SECRETS = {"DATABASE_URL": "postgresql://charged@%s/charged" % CLOSED,
                 "PROVIDER_API_KEY": "sk_test_deploy_settings",
                 "WEBHOOK_SIGNING_SECRET": "whsec_deploy_settings"}


def load_settings():
    return {"k8s": load_kubernetes(), "compose": load_compose()["compose"]}


def to_loopback(name, value):
    """value, with addresses of other machines moved to a closed loopback
    port and listeners to a free loopback port."""
    if name == "KAFKA_BOOTSTRAP_SERVERS":
        return CLOSED
    if name == "PROVIDER_BASE_URL":
        return "http://" + CLOSED
    if name in ("ADMIN_ADDR", "API_ADDR", "CONSOLE_ADDR"):
        check(re.fullmatch(r"0\.0\.0\.0:\d+", value), "%s=%r is not 0.0.0.0:PORT" % (name, value))
        # The admin listener takes port 0 (any free one): nothing can take
        # it between the choice and the bind.
        return "127.0.0.1:%d" % (0 if name == "ADMIN_ADDR" else free_port())
    return value


def pod_env(ctx, kind, name, tmp):
    """The environment of the first container of kind/name, as the kubelet
    would build it (envFrom, then env), for a run on this machine."""
    spec = template_of(one(ctx, kind, name))["spec"]
    c = spec["containers"][0]
    mounts = {m["name"]: m["mountPath"] for m in c.get("volumeMounts", [])}
    files = {}
    for v in spec.get("volumes", []):
        if "secret" in v and v["name"] in mounts:
            for item in v["secret"]["items"]:
                path = os.path.join(tmp, item["path"])
                with open(path, "w") as f:
                    f.write(DUMMY_SECRETS[item["key"]] + "\n")  # as a file ends
                files[os.path.join(mounts[v["name"]], item["path"])] = path
    env = {}
    for src in c.get("envFrom", []):
        env.update(one(ctx, "ConfigMap", src["configMapRef"]["name"])["data"])
    for e in c.get("env", []):
        if "value" in e:
            env[e["name"]] = files.get(e["value"], e["value"])
        elif "fieldRef" in e["valueFrom"]:
            check_eq(e["valueFrom"]["fieldRef"]["fieldPath"], "metadata.name", "fieldRef")
            env[e["name"]] = name + "-0"
        else:
            ref = e["valueFrom"]["configMapKeyRef"]
            env[e["name"]] = one(ctx, "ConfigMap", ref["name"])["data"][ref["key"]]
    return {k: to_loopback(k, v) for k, v in env.items()}, c


def compose_service_env(compose, service, tmp):
    env = dict(compose_env(compose["services"][service]))
    for k, v in list(env.items()):
        m = re.fullmatch(r"/run/secrets/([\w-]+)", str(v))
        if m:
            src = os.path.join(os.path.dirname(COMPOSE), compose["secrets"][m.group(1)]["file"])
            value = read(src)
            if m.group(1) == "database_url":
                check(re.fullmatch(r"postgresql://[^@\s]+@postgres:5432/charged\n?", value),
                      "compose: database_url secret %r" % value)
                value = re.sub(r"@postgres:5432/", "@%s/" % CLOSED, value)
            path = os.path.join(tmp, m.group(1))
            with open(path, "w") as f:
                f.write(value)
            env[k] = path
    return {k: to_loopback(k, str(v)) for k, v in env.items()}


class Run:
    """A program started with exactly env (and PATH), its output collected."""

    def __init__(self, argv, env):
        self.argv = argv
        full = {"PATH": "/usr/bin:/bin"}
        full.update(env)  # env may bring its own PATH
        self.out = []
        self.p = subprocess.Popen(argv, env=full, stdout=subprocess.PIPE,
                                  stderr=subprocess.STDOUT, text=True)
        self.reader = threading.Thread(target=self._read, daemon=True)
        self.reader.start()

    def _read(self):
        for line in self.p.stdout:
            self.out.append(line.rstrip("\n"))

    def text(self):
        return "\n".join(self.out)

    def stop(self):
        if self.p.poll() is None:
            self.p.send_signal(signal.SIGTERM)
            try:
                self.p.wait(timeout=60)
            except subprocess.TimeoutExpired:
                self.p.kill()
                self.p.wait()
        self.reader.join(timeout=10)


def expect_started(argv, env, marker, what):
    """Starts argv, waits until its output holds marker (it got past its
    configuration) or it exits, then stops it with SIGTERM."""
    check(os.path.isfile(argv[0]), "%s is not built" % argv[0])
    r = Run(argv, env)
    try:
        wait_until("%s to start" % what,
                   lambda: marker in r.text() or r.p.poll() is not None, 30)
        check(marker in r.text(), lambda: "%s exited %s before starting: %s" % (
            what, r.p.poll(), r.text()[-600:]))
    finally:
        r.stop()
    check(r.p.returncode != 2, "%s: exit 2 after SIGTERM: %s" % (what, r.text()[-600:]))


def charged_bin():
    return os.path.join(BUILD, "worker", "charged")


def settings_kubernetes_roles_start(ctx):
    for role in ROLES:
        kind = "StatefulSet" if role == "worker" else "Deployment"
        with tempfile.TemporaryDirectory() as tmp:
            env, c = pod_env(ctx["k8s"], kind, "charged-" + role, tmp)
            expect_started([charged_bin()] + c["args"], env, STARTED[role],
                           "Kubernetes %s" % role)


def settings_kubernetes_migration_reads_its_url(ctx):
    with tempfile.TemporaryDirectory() as tmp:
        env, c = pod_env(ctx["k8s"], "Job", "charged-migrate", tmp)
        argv = [os.path.join(BUILD, "worker", "chargectl", c["command"][0])] + c["args"]
        r = subprocess.run(argv, env=dict(env, PATH="/usr/bin:/bin"), capture_output=True,
                           text=True, timeout=60)
    # The database is a closed port: 1 (unreachable), never 2 (bad settings).
    check_eq(r.returncode, 1, "exit of the migration Job's command (stderr %r)" % r.stderr.strip())


def settings_kubernetes_daily_audit_reads_its_settings(ctx):
    """The CronJob charged-audit's chargectl takes its environment: with the
    database a closed port it exits 1 (unreachable), never 2 (a setting
    refused). Whether it gets the provider key is k8s_secrets_only_by_reference's."""
    with tempfile.TemporaryDirectory() as tmp:
        env, c = pod_env(ctx["k8s"], "CronJob", "charged-audit", tmp)
        argv = [os.path.join(BUILD, "worker", "chargectl", c["command"][0])] + c["args"]
        check(os.path.isfile(argv[0]), "%s is not built" % argv[0])
        r = subprocess.run(argv, env=dict(env, PATH="/usr/bin:/bin"), capture_output=True,
                           text=True, timeout=60)
    check_eq(r.returncode, 1, "exit of the daily audit's command (stderr %r)" % r.stderr.strip())


def settings_compose_roles_start(ctx):
    for role in ROLES:
        with tempfile.TemporaryDirectory() as tmp:
            env = compose_service_env(ctx["compose"], role, tmp)
            expect_started([charged_bin()] + ctx["compose"]["services"][role]["command"], env,
                           STARTED[role], "compose %s" % role)


def settings_compose_psp_sim_starts(ctx):
    svc = ctx["compose"]["services"]["psp-sim"]
    # Compose turns $$ into $; the ports become ones the kernel picks, the
    # api's address a closed loopback port, the secret file a copy.
    script = psp_sim_script(svc).replace("$$", "$")
    script = re.sub(r"--(port|admin-port) \d+", r"--\1 0", script)
    script = script.replace("--host 0.0.0.0", "--host 127.0.0.1")
    script = script.replace("http://api:8080/", "http://%s/" % CLOSED)
    with tempfile.TemporaryDirectory() as tmp:
        for name in svc.get("secrets", []):
            src = os.path.join(os.path.dirname(COMPOSE), ctx["compose"]["secrets"][name]["file"])
            dst = os.path.join(tmp, name)
            with open(dst, "w") as f:
                f.write(read(src))
            script = script.replace("/run/secrets/" + name, dst)
        check("/run/secrets/" not in script, "compose: psp-sim reads a secret it is not given")
        env = compose_service_env(ctx["compose"], "psp-sim", tmp)
        env["PATH"] = os.path.join(BUILD, "tools", "psp-sim") + ":/usr/bin:/bin"
        expect_started(svc["entrypoint"] + [script], env, "psp-sim listening", "compose psp-sim")


SETTINGS_CHECKS = [
    settings_kubernetes_roles_start, settings_kubernetes_migration_reads_its_url,
    settings_kubernetes_daily_audit_reads_its_settings,
    settings_compose_roles_start, settings_compose_psp_sim_starts,
]


def drop_env(ctx, kind, name, var):
    c = one(ctx["k8s"], kind, name)["spec"]["template"]["spec"]["containers"][0]
    c["env"] = [e for e in c["env"] if e["name"] != var]


SETTINGS_MUTANTS = [
    ("an api without its webhook secret", settings_kubernetes_roles_start,
     lambda c: drop_env(c, "Deployment", "charged-api", "WEBHOOK_SIGNING_SECRET_FILE")),
    ("an auditor without the provider key", settings_kubernetes_roles_start,
     lambda c: drop_env(c, "Deployment", "charged-auditor", "PROVIDER_API_KEY_FILE")),
    ("an auditor's window of part of a second", settings_compose_roles_start,
     lambda c: c["compose"]["services"]["auditor"]["environment"].update(AUDITOR_WINDOW_MS="1500")),
    ("a daily audit with a bad log level", settings_kubernetes_daily_audit_reads_its_settings,
     lambda c: set_env(container(c["k8s"], "CronJob", "charged-audit"), "LOG_LEVEL", "verbose")),
    ("a worker with a drain beyond its range", settings_kubernetes_roles_start,
     lambda c: set_env(one(c["k8s"], "StatefulSet", "charged-worker")["spec"]["template"]["spec"]
                       ["containers"][0], "SHUTDOWN_TIMEOUT_MS", "3600001")),
    ("psp-sim without the webhook secret file", settings_compose_psp_sim_starts,
     lambda c: c["compose"]["services"]["psp-sim"].pop("secrets")),
    ("a Kafka property librdkafka does not know", settings_compose_roles_start,
     lambda c: c["compose"]["services"]["worker"]["environment"].update(KAFKA_SESION_TIMEOUT_MS="1")),
]

# --------------------------------------------------------------------------

AREAS = {
    "kubernetes": (load_kubernetes, KUBERNETES_CHECKS, KUBERNETES_MUTANTS),
    "compose": (load_compose, COMPOSE_CHECKS, COMPOSE_MUTANTS),
    "image": (load_image, IMAGE_CHECKS, IMAGE_MUTANTS),
    "observability": (load_observability, OBSERVABILITY_CHECKS, OBSERVABILITY_MUTANTS),
    "settings": (load_settings, SETTINGS_CHECKS, SETTINGS_MUTANTS),
}


def main(argv):
    if len(argv) != 2 or argv[1] not in AREAS:
        print("usage: %s %s" % (argv[0], "|".join(AREAS)), file=sys.stderr)
        return 2
    load, checks, mutants = AREAS[argv[1]]
    passed = failed = 0
    try:
        ctx = load()
    except (OSError, yaml.YAMLError, ValueError, Failure) as e:
        print("FAIL loading %s files: %s" % (argv[1], e))
        print("0 passed, 1 failed")
        return 1
    if "source" in ctx:
        print("metric names from %s" % ctx["source"])
    for fn in checks:
        try:
            fn(copy.deepcopy(ctx))
            print("ok    %s" % fn.__name__)
            passed += 1
        except Failure as e:
            print("FAIL  %s: %s" % (fn.__name__, e))
            failed += 1
        except Exception as e:  # a file not shaped as the check expects
            print("FAIL  %s: %s: %s" % (fn.__name__, type(e).__name__, e))
            failed += 1
    # The checks must see what they are for: each mutant is a broken copy
    # that its check has to refuse.
    for what, fn, mutate in mutants:
        broken = copy.deepcopy(ctx)
        mutate(broken)
        try:
            fn(broken)
            print("FAIL  %s accepted %s" % (fn.__name__, what))
            failed += 1
        except Failure as e:
            print("ok    %s refuses %s (%s)" % (fn.__name__, what, e))
            passed += 1
        except Exception as e:  # crashed rather than refused: no check
            print("FAIL  %s on %s: %s: %s" % (fn.__name__, what, type(e).__name__, e))
            failed += 1
    print("%d passed, %d failed" % (passed, failed))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
