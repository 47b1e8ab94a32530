#!/usr/bin/env python3
"""The image itself: deploy/docker/Dockerfile built, and what it holds run.

  1. a base image made by `debootstrap --variant=minbase` from the mirror
     this machine's apt sources name (nothing is pulled from an image
     registry), cached as a tarball under the build tree per release;
  2. `podman build --isolation chroot --pull=never` of the Dockerfile;
  3. from the image's root (`podman mount` of a container that is created,
     never started: containers cannot run here), under `chroot` with the
     host's network, as the image's USER with the image's ENV: every role's
     --help, chargectl's and psp-sim's; ldd of the binaries (librdkafka
     from /opt/charged/librdkafka, the version deploy/librdkafka/build.sh
     pins, no librdkafka1 package); `chargectl migrate` into a database of
     its own; and one `charged worker` charging one command against the
     test stack (its own topics and group, the image's psp-sim), judged by
     psp-sim's ledger and the attempt's row;
  4. the runtime image's size, printed;
  5. hadolint on the Dockerfile (deploy/.tools/bin/hadolint).

Exits 77 (CTest's SKIP_RETURN_CODE) when podman, debootstrap or chroot is
missing or when not run as root. Needs the test stack (CHARGED_TEST_DATABASE_URL,
CHARGED_TEST_KAFKA), the build's kafka_test_tool (CHARGED_BUILD_DIR) and psql.
CHARGED_IMAGE_NO_CACHE=1 builds without podman's layer cache (to measure a
cold build); the cached base is kept (delete <build>/image-base to make it
again). Python standard library only.
"""
import glob
import hashlib
import json
import os
import queue
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
import uuid

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "e2e"))
from charged_e2e import Failure, check, check_eq, log, new_command, scaled, wait_until  # noqa: E402

SKIP = 77
ROOT = os.environ.get("CHARGED_SOURCE_DIR") or os.path.normpath(os.path.join(HERE, "..", ".."))
BUILD = os.path.abspath(os.environ.get("CHARGED_BUILD_DIR") or os.path.join(ROOT, "build"))
DOCKERFILE = os.path.join(ROOT, "deploy", "docker", "Dockerfile")
HADOLINT = os.path.join(ROOT, "deploy", ".tools", "bin", "hadolint")
KAFKA_TOOL = os.path.join(BUILD, "tests", "kafka_test_tool")
BASE_DIR = os.path.join(BUILD, "image-base")
# podman's images and containers of this test: a store of its own in the
# build tree (its run state on /run, which a reboot clears), so that it can
# prune what it made without touching anyone else's, and removing the build
# tree removes them.
STORE = os.path.join(BUILD, "image-test", "storage")
RUNROOT = "/run/charged-image-test-%s" % hashlib.sha256(STORE.encode()).hexdigest()[:12]
PODMAN = ["podman", "--root", STORE, "--runroot", RUNROOT]
RDKAFKA_LIB = "/opt/charged/librdkafka/lib/librdkafka.so.1"
ROLES = ("worker", "reconciler", "relay", "api", "auditor")
API_KEY = "sk_test_image"
BASE_LABEL = "org.charged.base-tarball-sha256"
CTR_LABEL = "org.charged.image-test-pid"
# A sanity bound only: the size is reported, not judged.
MAX_IMAGE_BYTES = 1 << 30
# What the base must carry over from this machine's apt configuration for
# its mirror to be usable at all: a mirror frozen at a date (a snapshot)
# serves Release files whose Valid-Until has passed, and this machine says
# so in its own apt.conf.d. Only these options, never proxies or auth.
APT_OPTIONS = ("Acquire::Check-Valid-Until", "Acquire::Check-Date", "Acquire::Max-ValidTime")
# The official -slim images drop these with dpkg path-excludes: the slim
# base here does the same to the same minbase, so that the size reported
# is near the one of an image built on the official slim.
SLIM_DROPPED = ("usr/share/doc", "usr/share/man", "usr/share/info", "usr/share/locale",
                "usr/share/groff", "usr/share/linda", "usr/share/lintian/overrides")

timings = []  # (what, seconds)


def timed(what, fn, *args):
    t0 = time.monotonic()
    try:
        return fn(*args)
    finally:
        dt = time.monotonic() - t0
        timings.append((what, dt))
        log("%s: %.1fs" % (what, dt))


def run(argv, timeout=120, what=None, **kw):
    """argv's CompletedProcess (text); Failure unless it exits 0."""
    kw.setdefault("capture_output", True)
    if "input" not in kw:
        kw.setdefault("stdin", subprocess.DEVNULL)
    try:
        p = subprocess.run(argv, text=True, timeout=scaled(timeout), **kw)
    except subprocess.TimeoutExpired:
        raise Failure("%s did not finish within %.0fs" % (what or argv[:3], scaled(timeout)))
    if p.returncode != 0:
        raise Failure("%s exited %d: %s" % (what or argv[:3], p.returncode,
                                            ((p.stdout or "") + (p.stderr or ""))[-3000:]))
    return p


def run_logged(argv, path, timeout, what):
    """argv with its output in the file at path, the mirror's address in
    it written <mirror> (no host name is written anywhere); Failure unless
    it exits 0 within timeout seconds."""
    host = re.sub(r"^[a-z]+://", "", mirror()).split("/", 1)[0]
    p = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                         stdin=subprocess.DEVNULL, text=True, errors="replace")

    def copy():
        with open(path, "w") as out:
            for line in p.stdout:
                out.write(line.replace(host, "<mirror>"))
    t = threading.Thread(target=copy, daemon=True)
    t.start()
    try:
        rc = p.wait(timeout=scaled(timeout))
    except subprocess.TimeoutExpired:
        p.kill()
        p.wait()
        raise Failure("%s did not finish within %.0fs; see %s" % (what, scaled(timeout), path))
    finally:
        t.join(timeout=30)
    if rc != 0:
        raise Failure("%s exited %d:\n%s\n(all of it in %s)" % (what, rc, open(path).read()[-4000:], path))


def skip_unless_possible():
    missing = [t for t in ("podman", "debootstrap", "chroot") if not shutil.which(t)]
    if missing:
        print("SKIP: %s not installed (deploy/install-deps.sh installs podman and debootstrap)"
              % " and ".join(missing))
        sys.exit(SKIP)
    if os.geteuid() != 0:
        print("SKIP: debootstrap, `podman mount` and chroot need root")
        sys.exit(SKIP)


def release():
    m = re.search(r"^ARG DEBIAN_RELEASE=(\S+)", open(DOCKERFILE).read(), re.M)
    check(m, "%s declares no ARG DEBIAN_RELEASE" % DOCKERFILE)
    return m.group(1)


_mirror = []


def mirror():
    """The first mirror of Debian's main archive in this machine's apt
    sources (never the security one), read as deploy/librdkafka/build.sh
    reads it: no host name is written anywhere."""
    if _mirror:
        return _mirror[0]
    files = ["/etc/apt/sources.list"] + sorted(glob.glob("/etc/apt/sources.list.d/*.list")) + \
        sorted(glob.glob("/etc/apt/sources.list.d/*.sources"))
    for f in files:
        if not os.path.isfile(f):
            continue
        for line in open(f, encoding="utf-8", errors="replace"):
            w = line.split()
            if not w or "security" in line:
                continue
            if w[0] == "deb":
                urls = [x for x in w[1:] if re.match(r"(https?|ftp)://", x)]
                if urls:
                    _mirror.append(urls[0])
                    return urls[0]
            if w[0] == "URIs:" and len(w) > 1:
                _mirror.append(w[1])
                return w[1]
    raise Failure("no Debian mirror in this machine's apt sources")


def apt_conf():
    """The lines of this machine's apt configuration the base carries over."""
    out = run(["apt-config", "dump"]).stdout
    return "".join(l + "\n" for l in out.splitlines() if l.split(" ", 1)[0] in APT_OPTIONS)


def sha256(path):
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def tar_rootfs(root, out):
    """root as a tarball podman can import: no device nodes (the runtime
    gives /dev), no downloaded .debs or package lists (as Debian's images)."""
    tmp = out + ".part"
    run(["tar", "-C", root, "--numeric-owner", "--xattrs",
         "--exclude=./dev/*", "--exclude=./proc/*", "--exclude=./sys/*",
         "--exclude=./var/cache/apt/archives/*.deb", "--exclude=./var/lib/apt/lists/*",
         "-cf", tmp, "."], timeout=600, what="tar of the base")
    os.replace(tmp, out)


def slim_down(root):
    """What the official -slim images leave out, and the dpkg configuration
    that keeps it out of what apt installs later (the copyright files stay)."""
    for d in SLIM_DROPPED:
        top = os.path.join(root, d)
        if not os.path.isdir(top):
            continue
        for dirpath, dirnames, filenames in os.walk(top, topdown=False):
            for f in filenames:
                if not (d == "usr/share/doc" and f == "copyright"):
                    os.unlink(os.path.join(dirpath, f))
            for sub in dirnames:
                p = os.path.join(dirpath, sub)
                if os.path.islink(p):
                    os.unlink(p)
                elif not os.listdir(p):
                    os.rmdir(p)
    cfg = os.path.join(root, "etc", "dpkg", "dpkg.cfg.d", "charged-slim")
    with open(cfg, "w") as f:
        f.write("# As in Debian's -slim images (tests/deploy/test_image_build.py)\n")
        for d in SLIM_DROPPED:
            f.write("path-exclude /%s/*\n" % d)
        f.write("path-include /usr/share/doc/*/copyright\n")


def unmount_under(root):
    """What is still mounted under root (debootstrap can leave its /proc),
    deepest first."""
    with open("/proc/self/mounts") as f:
        points = [l.split()[1] for l in f]
    for pt in sorted((p for p in points if p == root or p.startswith(root + "/")), reverse=True):
        subprocess.run(["umount", "--lazy", pt], capture_output=True)


def base_tarballs(rel):
    """{tag: tarball} for debian:REL (the build stage's base) and
    debian:REL-slim (the runtime's), made once per build tree and release
    by debootstrap and kept under <build>/image-base."""
    os.makedirs(BASE_DIR, exist_ok=True)
    conf = apt_conf()
    # The stamp names the mirror by a digest only: no host name in a file.
    want = {"release": rel, "apt_conf": conf,
            "mirror_sha256": hashlib.sha256(mirror().encode()).hexdigest()}
    stamp = os.path.join(BASE_DIR, rel + ".json")
    tars = {rel: os.path.join(BASE_DIR, rel + ".tar"),
            rel + "-slim": os.path.join(BASE_DIR, rel + "-slim.tar")}
    try:
        have = json.load(open(stamp))
    except (OSError, ValueError):
        have = {}
    if all(have.get(k) == v for k, v in want.items()) and all(map(os.path.isfile, tars.values())):
        log("base: cached %s (debootstrap took %.0fs on %s)" % (
            ", ".join(tars.values()), have.get("debootstrap_seconds", 0), have.get("made", "?")))
        return tars, have
    # The root outside the build tree: debootstrap mounts /proc in it,
    # and whatever walks the tree meanwhile (a glob of the sources) would
    # walk every process's root.
    root = tempfile.mkdtemp(prefix="charged-%s-root." % rel)
    try:
        log("base: debootstrap --variant=minbase %s from this machine's mirror" % rel)
        t0 = time.monotonic()
        try:
            run_logged(["debootstrap", "--variant=minbase", rel, root, mirror()],
                       os.path.join(BASE_DIR, "debootstrap.log"), 1800, "debootstrap")
        finally:
            unmount_under(root)
        took = time.monotonic() - t0
        timings.append(("debootstrap", took))
        log("base: debootstrap took %.0fs" % took)
        if want["apt_conf"]:
            with open(os.path.join(root, "etc", "apt", "apt.conf.d", "99charged-mirror"), "w") as f:
                f.write("// This machine's settings for its mirror (tests/deploy/test_image_build.py)\n")
                f.write(want["apt_conf"])
        tar_rootfs(root, tars[rel])
        slim_down(root)
        tar_rootfs(root, tars[rel + "-slim"])
    finally:
        unmount_under(root)
        subprocess.run(["rm", "-rf", "--one-file-system", root])
    have = dict(want, debootstrap_seconds=round(took), made=time.strftime("%Y-%m-%d %H:%M"),
                sha256={tag: sha256(t) for tag, t in tars.items()})
    with open(stamp + ".part", "w") as f:
        json.dump(have, f, indent=1)
    os.replace(stamp + ".part", stamp)
    return tars, have


def image_id(ref):
    p = subprocess.run(PODMAN + ["image", "inspect", "--format", "{{.Id}}", ref],
                       capture_output=True, text=True)
    return p.stdout.strip() if p.returncode == 0 else None


def import_bases(tars, stamp):
    """localhost/debian:TAG from each tarball, unless that image already
    is this tarball (its label says so): imported again, it would be a new
    image and podman's layer cache would miss every step."""
    for tag, tar in tars.items():
        ref = "localhost/debian:" + tag
        digest = stamp["sha256"][tag]
        p = subprocess.run(PODMAN + ["image", "inspect", "--format",
                                     '{{index .Config.Labels "%s"}}' % BASE_LABEL, ref],
                           capture_output=True, text=True)
        if p.returncode == 0 and p.stdout.strip() == digest:
            continue
        run(PODMAN + ["import", "--change", "LABEL=%s=%s" % (BASE_LABEL, digest), tar, ref],
            timeout=600, what="podman import " + ref)
        log("base: imported", ref)


def build_image(rel, tag, logdir):
    old = image_id(tag)
    argv = PODMAN + ["build", "--isolation", "chroot", "--pull=never", "--network", "host",
                     "--layers", "--build-arg", "DEBIAN_RELEASE=" + rel,
                     "-f", DOCKERFILE, "--ignorefile", DOCKERFILE + ".dockerignore", "-t", tag]
    if os.environ.get("CHARGED_IMAGE_NO_CACHE") == "1":
        argv.append("--no-cache")
    argv.append(ROOT)
    path = os.path.join(logdir, "podman-build.log")
    log("build:", " ".join(argv[:-1]), "<repo>", "(log: %s)" % path)
    run_logged(argv, path, 3000, "podman build")
    new = image_id(tag)
    # The build stage tagged too, from the cache the build just made (so in
    # seconds): untagged, its steps would be pruned below, and the next
    # build would compile librdkafka again.
    stage = [a for a in argv if a != "--no-cache"]
    stage[stage.index("-t") + 1] = tag + "-build"
    stage[-1:-1] = ["--target", "build"]
    run_logged(stage, os.path.join(logdir, "podman-build-stage.log"), 600,
               "podman build --target build")
    # What these tags named before, the steps only it had and older bases
    # are untagged now: removed (from this test's own store), so that runs
    # do not pile up images. The steps of this build stay, as the next
    # one's cache.
    if old != new:
        subprocess.run(PODMAN + ["image", "prune", "--force"], capture_output=True)
    return new


class Image:
    """A container created from the image, never started, and its root
    mounted: programs run from there under chroot, as the image's USER with
    its ENV, in this machine's network namespace."""

    def __init__(self, ref):
        self.ref = ref
        self.ctr = self.root = None

    def open(self, name):
        info = json.loads(run(PODMAN + ["image", "inspect", self.ref]).stdout)[0]
        self.config = info.get("Config", {})
        self.size = int(info["Size"])
        self.ctr = run(PODMAN + ["create", "--name", name, "--label", "%s=%d" % (CTR_LABEL, os.getpid()),
                        self.ref]).stdout.strip()
        self.root = run(PODMAN + ["mount", self.ctr]).stdout.strip()
        check(os.path.isfile(os.path.join(self.root, "usr/local/bin/charged")),
              "no /usr/local/bin/charged under %s" % self.root)
        self.user = self.config.get("User") or "0:0"
        if ":" not in self.user:
            self.user += ":" + self.user
        self.env = dict(e.split("=", 1) for e in self.config.get("Env") or [])
        self.entrypoint = self.config.get("Entrypoint") or []

    def argv(self, argv, as_root=False):
        return ["chroot"] + ([] if as_root else ["--userspec=" + self.user]) + [self.root] + argv

    def environ(self, extra=None):
        e = dict(self.env)
        e.update(extra or {})
        return e

    def run(self, argv, extra_env=None, as_root=False, timeout=60, **kw):
        return run(self.argv(argv, as_root), env=self.environ(extra_env), timeout=timeout,
                   what="(image) " + " ".join(argv[:3]), **kw)

    def start(self, argv, log_path, extra_env=None, **kw):
        out = open(log_path, "ab")
        return subprocess.Popen(self.argv(argv), env=self.environ(extra_env), stdin=subprocess.DEVNULL,
                                stdout=kw.pop("stdout", out), stderr=out, **kw)

    def close(self):
        if self.root:
            subprocess.run(PODMAN + ["umount", self.ctr], capture_output=True)
        if self.ctr:
            subprocess.run(PODMAN + ["rm", "-f", self.ctr], capture_output=True)


def remove_stale_containers():
    """Containers an earlier run of this test left when it was killed (by
    CTest's timeout, say): those whose run's process is gone."""
    out = run(PODMAN + ["ps", "-a", "--filter", "label=" + CTR_LABEL,
               "--format", '{{.ID}} {{index .Labels "%s"}}' % CTR_LABEL]).stdout
    for line in out.splitlines():
        ctr, _, pid = line.partition(" ")
        if pid.isdigit() and not os.path.exists("/proc/%s" % pid):
            subprocess.run(PODMAN + ["umount", ctr], capture_output=True)
            subprocess.run(PODMAN + ["rm", "-f", ctr], capture_output=True)
            log("removed the container %s of an earlier run (pid %s, gone)" % (ctr[:12], pid))


def check_help(img):
    for role in ROLES:
        p = img.run(img.entrypoint + [role, "--help"])
        check("usage: charged %s" % role in p.stdout + p.stderr,
              "charged %s --help printed no usage: %r" % (role, (p.stdout + p.stderr)[:300]))
    cmd = img.config.get("Cmd") or []
    p = img.run(img.entrypoint + cmd)
    check("Roles:" in p.stdout + p.stderr, "the image's default command printed %r" % p.stdout[:300])
    for prog, marker in (("chargectl", "usage: chargectl"), ("psp-sim", "usage: psp-sim")):
        p = img.run([prog, "--help"])
        check(marker in p.stdout + p.stderr, "%s --help printed %r" % (prog, p.stdout[:300]))
    log("help: every role, the default command, chargectl and psp-sim")


def ldd(img, path):
    out = img.run(["ldd", path], as_root=True).stdout
    libs = {}
    for line in out.splitlines():
        m = re.match(r"\s*(\S+) => (.*?)(?: \(0x[0-9a-f]+\))?$", line)
        if m:
            libs[m.group(1)] = m.group(2)
    check(libs, "ldd %s printed no libraries: %r" % (path, out))
    missing = [so for so, where in libs.items() if "not found" in where]
    check(not missing, "in the image, %s does not find %s" % (path, missing))
    return libs


def pinned_rdkafka_version():
    text = open(os.path.join(ROOT, "deploy", "librdkafka", "build.sh")).read()
    return re.search(r"^version=(\S+)", text, re.M).group(1)


def check_libraries(img):
    for b in ("charged", "chargectl", "psp-sim"):
        libs = ldd(img, "/usr/local/bin/" + b)
        if b != "psp-sim":
            check_eq(libs.get("librdkafka.so.1"), RDKAFKA_LIB, "where %s's librdkafka comes from" % b)
    ldd(img, RDKAFKA_LIB)  # and that library's own dependencies are there
    p = subprocess.run(img.argv(["dpkg-query", "-W", "-f", "${Package} ${Version}\\n", "librdkafka*"],
                                as_root=True), capture_output=True, text=True, env=img.environ())
    check(not p.stdout.strip(), "the image has Debian's librdkafka packages: %r" % p.stdout)
    check(p.returncode == 0 or "no packages found" in p.stderr,
          "dpkg-query in the image exited %d: %s" % (p.returncode, p.stderr))
    log("libraries: all found; librdkafka from %s, no librdkafka package (its version: the "
        "worker's own log, below)" % RDKAFKA_LIB)


class Stack:
    """The test stack's PostgreSQL and Kafka, a database, topics and a group
    of this run's own."""

    def __init__(self, tag):
        self.tag = tag
        self.created_db = False

    @staticmethod
    def require():
        """What the stack part needs, asked before minutes of building."""
        for var in ("CHARGED_TEST_DATABASE_URL", "CHARGED_TEST_KAFKA"):
            check(os.environ.get(var), "%s is not set: the test needs the test stack "
                  "(tools/run-all-tests.sh sets it; see deploy/stack.sh env)" % var)
        check(os.path.isfile(KAFKA_TOOL), "%s is not built" % KAFKA_TOOL)
        check(shutil.which("psql"), "psql is not installed")

    def open(self):
        tag = self.tag
        self.require()
        self.admin_db = os.environ["CHARGED_TEST_DATABASE_URL"]
        self.kafka = os.environ["CHARGED_TEST_KAFKA"]
        self.dbname = tag.lower()
        self.db = self.admin_db.rsplit("/", 1)[0] + "/" + self.dbname
        self.topics = {k: "image.%s.%s" % (tag, k) for k in ("commands", "results", "dlq")}
        self.group = "image-" + tag
        self.psql(self.admin_db, 'CREATE DATABASE "%s"' % self.dbname)
        self.created_db = True
        for k, n in (("commands", 3), ("results", 1), ("dlq", 1)):
            self.tool("create-topic", self.topics[k], str(n))

    def psql(self, url, sql):
        return run(["psql", "-X", "-q", "-tA", "-v", "ON_ERROR_STOP=1", url, "-c", sql],
                   what="psql").stdout

    def rows(self, sql):
        return [l.split("|") for l in self.psql(self.db, sql).splitlines() if l]

    def tool(self, *args):
        return run([KAFKA_TOOL] + list(args), what="kafka_test_tool " + args[0],
                   env=dict(os.environ, KAFKA_BOOTSTRAP_SERVERS=self.kafka)).stdout

    def env(self):
        e = {
            "DATABASE_URL": self.db,
            "KAFKA_BOOTSTRAP_SERVERS": self.kafka,
            "KAFKA_GROUP_ID": self.group,
            "CHARGE_COMMANDS_TOPIC": self.topics["commands"],
            "CHARGE_RESULTS_TOPIC": self.topics["results"],
            "CHARGE_DLQ_TOPIC": self.topics["dlq"],
            "LOG_LEVEL": "info",
            # The image listens on every interface (its ENV); here, beside
            # the other tests, on a loopback port the kernel picks.
            "ADMIN_ADDR": "127.0.0.1:0",
        }
        if os.environ.get("CHARGED_TEST_GROUP_PROTOCOL") == "consumer":
            e["KAFKA_GROUP_PROTOCOL"] = "consumer"
        return e

    def close(self):
        if self.created_db:
            subprocess.run(["psql", "-X", "-q", "-v", "ON_ERROR_STOP=1", self.admin_db, "-c",
                            'DROP DATABASE IF EXISTS "%s" WITH (FORCE)' % self.dbname],
                           capture_output=True)


def check_migrate(img, stack):
    img.run(["chargectl", "migrate"], extra_env=stack.env())
    # migrations/ and every operation's own, as the binaries embed them.
    files = sorted(os.path.basename(f) for f in
                   glob.glob(os.path.join(ROOT, "migrations", "*.sql")) +
                   glob.glob(os.path.join(ROOT, "worker", "operations", "*", "migrations",
                                          "*.sql")))
    applied = [r[0] for r in stack.rows("SELECT name FROM schema_migrations ORDER BY version")]
    check_eq(applied, files, "the migrations chargectl migrate applied from the image")
    img.run(["chargectl", "migrate"], extra_env=stack.env())  # a no-op now
    log("migrate: %d migrations applied, a second run a no-op" % len(applied))


def start_psp(img, logdir, procs):
    """The image's psp-sim on ports the kernel picks: it names them in its
    first stdout line once it listens."""
    path = os.path.join(logdir, "psp-sim.log")
    p = img.start(["psp-sim", "--port", "0", "--admin-port", "0", "--api-key", API_KEY], path,
                  stdout=subprocess.PIPE)
    procs.append(p)
    first = queue.Queue()

    def drain():
        with open(path, "ab") as out:
            for line in iter(p.stdout.readline, b""):
                if first.empty():
                    first.put(line)
                out.write(line)
                out.flush()
        first.put(b"")
    threading.Thread(target=drain, daemon=True).start()
    try:
        line = first.get(timeout=scaled(15))
    except queue.Empty:
        line = b""
    m = re.match(rb"psp-sim listening port=(\d+) admin_port=(\d+)\n\Z", line)
    check(m, "the image's psp-sim printed %r (exit %s); see %s" % (line, p.poll(), path))
    return int(m.group(1)), int(m.group(2))


def psp_get(admin, path):
    with urllib.request.urlopen("http://127.0.0.1:%d%s" % (admin, path), timeout=10) as r:
        return json.load(r)


def check_worker_charges(img, stack, logdir, procs):
    port, admin = start_psp(img, logdir, procs)
    wait_until("the image's psp-sim to answer", lambda: psp_get(admin, "/health").get("ok"), 15)
    env = dict(stack.env(), PROVIDER_API_KEY=API_KEY, PROVIDER_BASE_URL="http://127.0.0.1:%d" % port,
               WORKER_ID="image-worker-" + uuid.uuid4().hex[:6])
    cmd = new_command(amount=4242)
    img.run(["chargectl", "publish", "--file", "-"], extra_env=env, input=json.dumps(cmd) + "\n")
    path = os.path.join(logdir, "worker.log")
    worker = img.start(img.entrypoint + ["worker"], path, extra_env=env)
    procs.append(worker)

    def settled():
        check(worker.poll() is None, lambda: "the worker exited %s; see %s" % (worker.returncode, path))
        rows = stack.rows("SELECT status, coalesce(provider_payment_id, ''), amount FROM "
                          "payment_attempts WHERE id = '%s'" % cmd["payment_attempt_id"])
        return rows and rows[0][0] == "SUCCEEDED" and rows[0]
    status, ppid, amount = wait_until("the image's worker to charge the command", settled, 90)
    charges = [c for c in psp_get(admin, "/ledger")["charges"]
               if c["idempotency_key"] == cmd["idempotency_key"]]
    check_eq(len(charges), 1, "charges at psp-sim for the command's key")
    c = charges[0]
    check_eq((c["outcome"], int(c["amount"]), c["payment_intent_id"], c["payment_attempt_id"]),
             ("succeeded", 4242, ppid, cmd["payment_attempt_id"]), "psp-sim's charge")
    check_eq(int(amount), 4242, "the attempt's amount")
    started = [json.loads(l) for l in open(path, "rb") if b'"worker started"' in l]
    check(started, "the worker logged no \"worker started\"; see %s" % path)
    check_eq(started[0].get("librdkafka"), pinned_rdkafka_version(),
             "the librdkafka the image's worker runs on (deploy/librdkafka/build.sh's pin)")

    def committed():
        check(worker.poll() is None, lambda: "the worker exited %s; see %s" % (worker.returncode, path))
        return json.loads(stack.tool("lag", stack.group, stack.topics["commands"]))["lag"] == 0
    wait_until("the image's worker to commit its offset", committed, 60)
    worker.send_signal(signal.SIGTERM)
    try:
        rc = worker.wait(timeout=scaled(60))
    except subprocess.TimeoutExpired:
        raise Failure("the image's worker did not exit within %.0fs of SIGTERM" % scaled(60))
    check_eq(rc, 0, "the image's worker's exit status after SIGTERM (see %s)" % path)
    log("worker: on librdkafka %s, charged %s once (%s), offset committed, exit 0 on SIGTERM"
        % (started[0]["librdkafka"], cmd["payment_attempt_id"], ppid))


def lint():
    check(os.access(HADOLINT, os.X_OK), "%s is missing (deploy/install-deps.sh installs it, "
          "pinned in tests/deploy/requirements.txt)" % HADOLINT)
    p = subprocess.run([HADOLINT, "--no-color", DOCKERFILE], capture_output=True, text=True)
    check(p.returncode == 0, "hadolint: %s" % (p.stdout + p.stderr))
    log("hadolint: no findings (%s)" % run([HADOLINT, "--version"]).stdout.strip())


def mb(n):
    return "%.1f MB" % (n / 1e6)


def main():
    skip_unless_possible()
    signal.signal(signal.SIGTERM, lambda *_: sys.exit("terminated"))  # run the cleanup
    t_all = time.monotonic()
    tag = "charged_image_%d_%s" % (os.getpid(), uuid.uuid4().hex[:6])
    logdir = os.path.join(BUILD, "image-test", "logs", tag)
    os.makedirs(logdir)
    img = stack = None
    procs = []
    try:
        Stack.require()
        timed("hadolint", lint)
        remove_stale_containers()
        rel = release()
        tars, stamp = timed("base image", base_tarballs, rel)
        timed("podman import", import_bases, tars, stamp)
        ref = "localhost/charged-image-test:" + rel
        timed("podman build", build_image, rel, ref, logdir)
        img = Image(ref)
        img.open(tag.replace("_", "-"))
        timed("help", check_help, img)
        timed("libraries", check_libraries, img)
        stack = Stack(tag)
        stack.open()
        timed("migrate", check_migrate, img, stack)
        timed("worker", check_worker_charges, img, stack, logdir, procs)
        base = json.loads(run(PODMAN + ["image", "inspect", "localhost/debian:%s-slim" % rel]).stdout)[0]
        log("size: the runtime image is %s (%s over its base, debian:%s-slim made here, %s)" % (
            mb(img.size), mb(img.size - int(base["Size"])), rel, mb(int(base["Size"]))))
        check(img.size < MAX_IMAGE_BYTES, "the image is %s" % mb(img.size))
    except Failure as e:
        print("FAIL: %s" % e, flush=True)
        print("logs: %s" % logdir)
        return 1
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait(timeout=30)
        if stack:
            stack.close()
        if img:
            img.close()
        timings.append(("whole test", time.monotonic() - t_all))
        print("times: " + ", ".join("%s %.0fs" % t for t in timings), flush=True)
    print("ok: the image builds, runs every role, migrates and charges (logs: %s)" % logdir)
    return 0


if __name__ == "__main__":
    sys.exit(main())
