#!/usr/bin/env python3
"""Every manifest under deploy/kubernetes validated against a schema, offline:

- Kubernetes' own kinds with kubernetes-validate's strict schemas (unknown
  fields refused, as kubectl's strict field validation does), against the
  Kubernetes versions pinned in KUBERNETES_VERSIONS below;
- KEDA's ScaledObject, which kubernetes-validate has no schema for, with
  jsonschema against keda-scaledobject.schema.json (beside this file,
  written from KEDA's CRD);
- a patch of a kustomization (roles-without-keda/worker-replicas.yaml) as
  the object it patches, merged, since the patch alone is no whole object.

An object that no schema covers fails: it is not skipped with a warning.
Then broken copies of the tree, written to a temporary directory (a
misspelt field, a wrong type, a trigger without type...), must each be
refused, with the message shown.

What the schemas cannot know (probes on the admin port, secrets by
reference, workers no more than partitions...) is checked by
test_deploy_files.py kubernetes.

Runs in the virtual environment deploy/.tools that deploy/install-deps.sh
makes from tests/deploy/requirements.txt (kubernetes-validate, jsonschema,
PyYAML): started by another python3, it starts itself again there, and it
fails if that environment is missing or stale.
"""
import copy
import glob
import json
import os
import shutil
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.environ.get("CHARGED_SOURCE_DIR") or os.path.normpath(os.path.join(HERE, "..", ".."))
TOOLS = os.path.join(ROOT, "deploy", ".tools")
REQUIREMENTS = os.path.join(HERE, "requirements.txt")
KEDA_SCHEMA = os.path.join(HERE, "keda-scaledobject.schema.json")

# The Kubernetes versions every manifest is validated against. Pinned, so
# that a newer kubernetes-validate (its default is the newest version it
# bundles) changes nothing by itself:
# - 1.27, the oldest Kubernetes the manifests are for (docs/operations.md:
#   the disruption budgets' unhealthyPodEvictionPolicy needs 1.27): a field
#   added since fails here, rather than being dropped or refused by an
#   older API server;
# - 1.37, the newest that kubernetes-validate 1.37.0 bundles: a field
#   removed since 1.27 fails too.
# Raise the first with the floor in docs/operations.md, the second with
# kubernetes-validate in requirements.txt.
KUBERNETES_VERSIONS = ("1.27.0", "1.37.0")


def fail_setup(why):
    print("FAIL  %s" % why)
    print("0 passed, 1 failed")
    sys.exit(1)


def same_path(a, b):
    return os.path.realpath(a) == os.path.realpath(b)


# Into deploy/.tools first, whichever python3 started this.
if not same_path(sys.prefix, TOOLS):
    python = os.path.join(TOOLS, "bin", "python3")
    if os.environ.get("CHARGED_IN_DEPLOY_TOOLS") or not os.access(python, os.X_OK):
        fail_setup("no Python environment in %s with kubernetes-validate: "
                   "run deploy/install-deps.sh" % TOOLS)
    os.environ["CHARGED_IN_DEPLOY_TOOLS"] = "1"
    os.execv(python, [python, os.path.abspath(__file__)] + sys.argv[1:])


def read(path):
    with open(path, encoding="utf-8") as f:
        return f.read()


def pinned(package):
    for line in read(REQUIREMENTS).splitlines():
        name, _, version = line.split("#")[0].strip().partition("==")
        if name.strip().lower() == package:
            return version.strip()
    fail_setup("%s is not pinned in %s" % (package, REQUIREMENTS))


installed = os.path.join(TOOLS, "requirements.txt")
if not os.path.exists(installed) or read(installed) != read(REQUIREMENTS):
    fail_setup("%s was not made from the current tests/deploy/requirements.txt: "
               "run deploy/install-deps.sh" % TOOLS)
try:
    import jsonschema
    import kubernetes_validate
    import kubernetes_validate.utils
    import yaml
except ImportError as e:
    fail_setup("%s in %s: run deploy/install-deps.sh" % (e, TOOLS))
if kubernetes_validate.__version__ != pinned("kubernetes-validate"):
    fail_setup("kubernetes-validate %s in %s, %s pinned: run deploy/install-deps.sh" % (
        kubernetes_validate.__version__, TOOLS, pinned("kubernetes-validate")))


class Refused(Exception):
    """The tree cannot be read as objects to validate."""


def rel(root, path):
    return os.path.relpath(path, root)


def load_docs(path):
    docs = [d for d in yaml.safe_load_all(read(path)) if d is not None]
    for d in docs:
        if not isinstance(d, dict):
            raise Refused("%s: a document that is not a mapping: %r" % (path, d))
    return docs


def merge(base, patch, where):
    """A strategic merge patch as far as the manifests use one: maps merged
    key by key, a null removes the key. Lists merge by their patch keys in
    kustomize; that is not done here, so a patch with a list is refused
    rather than merged wrong."""
    for k, v in patch.items():
        if k.startswith("$"):
            raise Refused("%s: directive %s is not merged by this test" % (where, k))
        if v is None:
            base.pop(k, None)
        elif isinstance(v, dict) and isinstance(base.get(k), dict):
            merge(base[k], v, where)
        elif isinstance(v, list):
            raise Refused("%s: the list %s would merge by its patch key in kustomize; "
                          "teach merge() in this test before patching a list" % (where, k))
        else:
            base[k] = copy.deepcopy(v)
    return base


def key(doc):
    return (doc.get("kind"), (doc.get("metadata") or {}).get("name"))


def manifests(root):
    """(label, object) of every object under root/deploy/kubernetes: each
    document of each resource file, and each patch merged into the object
    it patches."""
    k8s = os.path.join(root, "deploy", "kubernetes")
    patches = []  # (label, patch document)
    patch_files = set()
    for k in sorted(glob.glob(os.path.join(k8s, "**", "kustomization.yaml"), recursive=True)):
        d = os.path.dirname(k)
        for p in yaml.safe_load(read(k)).get("patches", []):
            if "target" in p:
                raise Refused("%s: a patch by target is not merged by this test; "
                              "teach manifests() before using one" % rel(root, k))
            if "path" in p:
                path = os.path.normpath(os.path.join(d, p["path"]))
                patch_files.add(path)
                patches += [(rel(root, path), doc) for doc in load_docs(path)]
            else:
                patches += [(rel(root, k) + " (inline patch)", doc)
                            for doc in yaml.safe_load_all(p.get("patch", "")) if doc]
    objects = []
    for path in sorted(glob.glob(os.path.join(k8s, "**", "*.yaml"), recursive=True)):
        if os.path.basename(path) == "kustomization.yaml" or path in patch_files:
            continue
        objects += [(rel(root, path), doc) for doc in load_docs(path)]
    merged = []
    for where, patch in patches:
        if not isinstance(patch, dict):
            raise Refused("%s: a patch that is not a mapping (a JSON patch?) is not "
                          "merged by this test" % where)
        targets = [(f, d) for f, d in objects if key(d) == key(patch)]
        if len(targets) != 1:
            raise Refused("%s: patches %d objects %s %s, not one" % (
                where, len(targets), *key(patch)))
        if patch.get("$patch") == "delete":
            continue
        f, target = targets[0]
        merged.append(("%s onto %s" % (where, f),
                       merge(copy.deepcopy(target), patch, where)))
    return [("%s: %s %s" % (f, *key(d)), d) for f, d in objects + merged]


def keda_validator():
    schema = json.loads(read(KEDA_SCHEMA))
    jsonschema.Draft202012Validator.check_schema(schema)
    return jsonschema.Draft202012Validator(schema)


# Custom resources, by (apiVersion, kind): the schema each is validated
# against, as (validator, file name); filled in by main().
CUSTOM = {}


def path_of(e):
    return ".".join(str(p) for p in e.absolute_path) or "(top)"


def problems(obj):
    """What the schemas refuse in obj, [] when it is valid."""
    if not isinstance(obj.get("apiVersion"), str) or not isinstance(obj.get("kind"), str):
        return ["no apiVersion or kind"]
    custom = CUSTOM.get((obj["apiVersion"], obj["kind"]))
    if custom:
        validator, name = custom
        return ["%s: %s: %s" % (name, path_of(e), e.message)
                for e in sorted(validator.iter_errors(obj), key=lambda e: list(map(str, e.absolute_path)))]
    found = []
    for version in KUBERNETES_VERSIONS:
        try:
            kubernetes_validate.validate(obj, version, strict=True)
        except kubernetes_validate.ValidationError as e:
            found.append("Kubernetes %s: %s: %s" % (version, path_of(e), e.message))
        except kubernetes_validate.SchemaNotFoundError as e:
            return ["no schema: %s; a custom resource needs one here, as the ScaledObject "
                    "has keda-scaledobject.schema.json" % e.message]
        except Exception as e:  # no schemas of that version, a broken bundle...
            found.append("Kubernetes %s: kubernetes-validate could not validate: %s: %s" % (
                version, type(e).__name__, getattr(e, "message", e)))
    return found


KNOWN = {}  # an object's JSON -> its problems: a broken copy revalidates only what changed


def validate_tree(root):
    """{label: [problem]} of every object under root."""
    found = {}
    for label, obj in manifests(root):
        text = json.dumps(obj, sort_keys=True)
        if text not in KNOWN:
            KNOWN[text] = problems(obj)
        found[label] = KNOWN[text]
    return found


# --------------------------------------------------------------------------
# Broken copies: (what, file under deploy/kubernetes, how to break its
# documents, what the refusal must say). Each must be refused for that
# object and with that message, not for some other reason.

def container(docs, kind):
    return next(d for d in docs if d["kind"] == kind)["spec"]["template"]["spec"]["containers"][0]


def env(docs, kind, name):
    return next(e for e in container(docs, kind)["env"] if e["name"] == name)


def scaled_object(docs):
    return next(d for d in docs if d["kind"] == "ScaledObject")["spec"]


def rename(d, old, new):
    d[new] = d.pop(old)


BROKEN = [
    ("a misspelt container field", "roles/reconciler.yaml",
     lambda docs: rename(container(docs, "Deployment"), "livenessProbe", "livenesProbe"),
     "'livenesProbe' was unexpected"),
    ('replicas: "two" in the patch of roles-without-keda', "roles-without-keda/worker-replicas.yaml",
     lambda docs: docs[0]["spec"].update(replicas="two"),
     "spec.replicas: 'two' is not of type 'integer'"),
    ("a number as an env value", "roles/relay.yaml",
     lambda docs: env(docs, "Deployment", "SHUTDOWN_TIMEOUT_MS").update(value=30000),
     "30000 is not of type 'string'"),
    ("a number as ConfigMap data", "shared/config.yaml",
     lambda docs: docs[0]["data"].update(WORKER_MAX_IN_FLIGHT=64),
     "data.WORKER_MAX_IN_FLIGHT: 64 is not of type 'string'"),
    ("a Job field newer than Kubernetes 1.27", "before-rollout/migrate-job.yaml",
     lambda docs: docs[0]["spec"].update(managedBy="kubernetes.io/job-controller"),
     "Kubernetes 1.27.0: spec: Additional properties are not allowed ('managedBy' was unexpected)"),
    ("a misspelt ScaledObject field", "roles/worker-autoscaling.yaml",
     lambda docs: rename(scaled_object(docs), "maxReplicaCount", "maxReplicaCont"),
     "spec: Additional properties are not allowed ('maxReplicaCont' was unexpected)"),
    ("a misspelt field of the HPA behaviour", "roles/worker-autoscaling.yaml",
     lambda docs: rename(scaled_object(docs)["advanced"]["horizontalPodAutoscalerConfig"]["behavior"]
                         ["scaleDown"], "stabilizationWindowSeconds", "stabilisationWindowSeconds"),
     "'stabilisationWindowSeconds' was unexpected"),
    ("a trigger without type", "roles/worker-autoscaling.yaml",
     lambda docs: scaled_object(docs)["triggers"][0].pop("type"),
     "spec.triggers.0: 'type' is a required property"),
    ("a number in a trigger's metadata", "roles/worker-autoscaling.yaml",
     lambda docs: scaled_object(docs)["triggers"][0]["metadata"].update(lagThreshold=500),
     "spec.triggers.0.metadata.lagThreshold: 500 is not of type 'string'"),
    ("a kind no schema covers", "roles/api.yaml",
     lambda docs: docs.append({"apiVersion": "monitoring.coreos.com/v1", "kind": "ServiceMonitor",
                               "metadata": {"name": "charged-api"}, "spec": {}}),
     "no schema: Couldn't find schema for kind ServiceMonitor"),
]


def refused(what, path, mutate, expect):
    """None if the broken copy is refused as it must be, else why not."""
    with tempfile.TemporaryDirectory(prefix="charged-manifests-") as tmp:
        shutil.copytree(os.path.join(ROOT, "deploy", "kubernetes"),
                        os.path.join(tmp, "deploy", "kubernetes"))
        target = os.path.join(tmp, "deploy", "kubernetes", path)
        docs = load_docs(target)
        mutate(docs)
        with open(target, "w", encoding="utf-8") as f:
            yaml.safe_dump_all(docs, f, sort_keys=False)
        found = validate_tree(tmp)
    mine = os.path.join("deploy", "kubernetes", path)

    def of_mine(label):  # the file's own objects, or a patch merged onto one
        return label.startswith(mine + ":") or (" onto %s:" % mine) in label \
            or label.startswith(mine + " onto ")
    hits = [p for label, ps in found.items() if of_mine(label) for p in ps]
    others = [p for label, ps in found.items() if not of_mine(label) for p in ps]
    if others:
        return None, "other objects refused too: %s" % others
    for p in hits:
        if expect in p:
            return p, None
    return None, "accepted" if not hits else "refused, but not with %r: %s" % (expect, hits)


def main():
    passed = failed = 0

    def ok(line):
        nonlocal passed
        print("ok    %s" % line)
        passed += 1

    def bad(line):
        nonlocal failed
        print("FAIL  %s" % line)
        failed += 1

    try:
        CUSTOM[("keda.sh/v1alpha1", "ScaledObject")] = (keda_validator(), os.path.basename(KEDA_SCHEMA))
        ok("%s is a JSON Schema (draft 2020-12)" % os.path.basename(KEDA_SCHEMA))
    except (OSError, ValueError, jsonschema.SchemaError) as e:
        bad("%s: %s" % (KEDA_SCHEMA, str(e).splitlines()[0]))
        print("%d passed, %d failed" % (passed, failed))
        return 1
    bundled = kubernetes_validate.utils.all_versions()
    for v in KUBERNETES_VERSIONS:
        # validate() would quietly take the closest older schema instead.
        if v in bundled:
            ok("kubernetes-validate %s has the schemas of Kubernetes %s" % (
                kubernetes_validate.__version__, v))
        else:
            bad("kubernetes-validate %s has no schemas of Kubernetes %s (it has %s)" % (
                kubernetes_validate.__version__, v, sorted(set(bundled))))
    try:
        found = validate_tree(ROOT)
    except (Refused, OSError, yaml.YAMLError) as e:
        bad("reading deploy/kubernetes: %s" % e)
        found = {}
    kinds = set()
    for label, ps in found.items():
        kinds.add(label.split(": ")[1].split(" ")[0])
        if ps:
            bad("%s:\n        %s" % (label, "\n        ".join(ps)))
        else:
            ok("valid  %s" % label)
    if "ScaledObject" not in kinds:
        bad("no ScaledObject validated: keda-scaledobject.schema.json checked nothing")
    for what, path, mutate, expect in BROKEN:
        try:
            message, why = refused(what, path, mutate, expect)
        except (Refused, OSError, yaml.YAMLError, KeyError, StopIteration) as e:
            message, why = None, "%s: %s" % (type(e).__name__, e)
        if message:
            ok("refuses %s (%s): %s" % (what, path, message))
        else:
            bad("%s (%s): %s" % (what, path, why))
    print("%d passed, %d failed" % (passed, failed))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
