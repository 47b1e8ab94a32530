#!/usr/bin/env python3
"""Wrong, expired or unreadable TLS material, and refused credentials, on the
production profile's Kafka: the worker and the relay each say one clear
line at start and exit 2 (bad configuration), instead of retrying and
logging the same handshake failure for ever while never becoming ready.

Cases, each for `charged worker` and `charged relay` with their role's
environment (kafka.sh env ROLE) and one setting changed:
- a CA that did not sign the brokers (made here);
- the brokers' own CA re-issued with its key and name but expired (valid
  in January 2020 only): what a trust store that was not renewed holds;
- a CA file that does not exist, and one that holds no certificate;
- the wrong principal's password.

Skips (77) unless CHARGED_PROD_STACK_DIR names a running production stack."""
import os
import subprocess

import prod_kafka
from prod_kafka import e2e
from charged_e2e import check, check_eq

CA_CNF = """[ca]
default_ca = expired
[expired]
dir = %(dir)s
database = %(dir)s/index.txt
serial = %(dir)s/serial
new_certs_dir = %(dir)s
default_md = sha256
policy = any
copy_extensions = none
x509_extensions = v3_ca
[any]
commonName = supplied
[v3_ca]
basicConstraints = critical,CA:true
keyUsage = critical,keyCertSign,cRLSign
subjectKeyIdentifier = hash
"""


def openssl(*args):
    p = subprocess.run(["openssl"] + list(args), capture_output=True)
    if p.returncode != 0:
        raise e2e.Failure("openssl %s: %s" % (args[0], p.stderr.decode()[-500:]))


def other_ca(d):
    path = os.path.join(d, "other-ca.crt")
    openssl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout",
            os.path.join(d, "other-ca.key"), "-subj", "/CN=charged production-profile CA",
            "-days", "30", "-out", path)
    return path


def expired_ca(d):
    """The stack's CA, same key and name, valid only in January 2020."""
    tls = os.path.join(os.environ["CHARGED_PROD_STACK_DIR"], "kafka-prod", "tls")
    w = os.path.join(d, "expired-ca")
    os.makedirs(w, exist_ok=True)
    open(os.path.join(w, "index.txt"), "w").close()
    with open(os.path.join(w, "serial"), "w") as f:
        f.write("01\n")
    with open(os.path.join(w, "ca.cnf"), "w") as f:
        f.write(CA_CNF % {"dir": w})
    openssl("x509", "-in", os.path.join(tls, "ca.crt"), "-x509toreq", "-signkey",
            os.path.join(tls, "ca.key"), "-out", os.path.join(w, "ca.csr"))
    path = os.path.join(d, "expired-ca.crt")
    openssl("ca", "-batch", "-config", os.path.join(w, "ca.cnf"), "-selfsign", "-keyfile",
            os.path.join(tls, "ca.key"), "-in", os.path.join(w, "ca.csr"), "-startdate",
            "20200101000000Z", "-enddate", "20200201000000Z", "-out", path)
    # The material is what the case says: it would verify but for its dates.
    p = subprocess.run(["openssl", "verify", "-CAfile", path, os.path.join(tls, "node1.crt")],
                       capture_output=True)
    check(b"certificate has expired" in p.stdout + p.stderr,
          "the re-issued CA is not merely expired: %s" % (p.stdout + p.stderr).decode())
    return path


def start_fails(s, role, change, want):
    """`charged ROLE` with its role's environment and `change`: exit 2
    within 60 s, one line of output, containing want."""
    env = s.env(prod_kafka.role_env(role))
    env.update(change)
    env["LOG_LEVEL"] = "info"
    try:
        p = subprocess.run([e2e.CHARGED, role], capture_output=True, env=env,
                           stdin=subprocess.DEVNULL, timeout=e2e.scaled(60))
    except subprocess.TimeoutExpired as t:
        out = ((t.stdout or b"") + (t.stderr or b"")).decode(errors="replace")
        raise e2e.Failure("charged %s with %s still ran after 60 s; its last output: %s"
                          % (role, change, out[-1500:]))
    lines = [l for l in (p.stdout + p.stderr).decode(errors="replace").splitlines()
             if l.strip()]
    e2e.log("charged %s, %s: exit %d: %s" % (role, sorted(change), p.returncode,
                                             lines[-1][:240] if lines else ""))
    check_eq(p.returncode, 2, "exit status of charged %s with %s" % (role, change))
    check_eq(len(lines), 1, "lines of output of charged %s with %s (%s)"
             % (role, change, lines[:4]))
    check(want in lines[0], "charged %s's line %r does not say %r" % (role, lines[0], want))


def scenario(new):
    s = new("prod_tls")
    other, expired = other_ca(s.dir), expired_ca(s.dir)
    garbage = os.path.join(s.dir, "not-a-ca.crt")
    with open(garbage, "w") as f:
        f.write("not a certificate\n")
    missing = os.path.join(s.dir, "missing-ca.crt")
    wrong_password = os.path.join(s.dir, "wrong.password")
    with open(wrong_password, "w") as f:
        f.write("not-the-password\n")
    for role in ("worker", "relay"):
        start_fails(s, role, {"KAFKA_SSL_CA_LOCATION": other},
                    "does not verify against KAFKA_SSL_CA_LOCATION (%s)" % other)
        start_fails(s, role, {"KAFKA_SSL_CA_LOCATION": expired},
                    "does not verify against KAFKA_SSL_CA_LOCATION (%s)" % expired)
        start_fails(s, role, {"KAFKA_SSL_CA_LOCATION": missing},
                    "KAFKA_SSL_CA_LOCATION: cannot read '%s'" % missing)
        start_fails(s, role, {"KAFKA_SSL_CA_LOCATION": garbage},
                    "Kafka TLS settings refused")
        start_fails(s, role, {"KAFKA_SASL_PASSWORD_FILE": wrong_password},
                    "Kafka refused the SASL credentials of KAFKA_SASL_USERNAME "
                    "'charged-%s'" % role)


if __name__ == "__main__":
    prod_kafka.stack_dir_or_skip()
    e2e.Scenario = prod_kafka.ProdScenario  # main()'s factory makes (and closes) these
    raise SystemExit(e2e.main(scenario))
