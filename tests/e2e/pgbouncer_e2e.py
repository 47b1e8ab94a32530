"""A PgBouncer (Debian's package, /usr/sbin/pgbouncer) in transaction pooling
in front of the test stack's PostgreSQL, on a free loopback port, for the
scenarios that run charged through a pooler. Python standard library only.

Every database name is passed through (`* =`), so a Scenario's own database
is reached under its own name; every server connection logs in as the stack's
`charged` role (trust on loopback, as the stack's PostgreSQL)."""
import os
import pwd
import shutil
import subprocess
import tempfile
import urllib.parse

import charged_e2e as e2e

PGBOUNCER = os.environ.get("CHARGED_PGBOUNCER", shutil.which("pgbouncer") or "/usr/sbin/pgbouncer")


class PgBouncer:
    """pool_mode = transaction, pool_size server connections per database at
    most (no reserve): few enough that every one of them is seen by a probe
    (server_sessions)."""

    def __init__(self, pool_size=2, target_url=None):
        target = urllib.parse.urlsplit(target_url or os.environ["CHARGED_TEST_DATABASE_URL"])
        self.pool_size = pool_size
        self.port = e2e.free_port()
        self.dir = tempfile.mkdtemp(prefix="charged-pgbouncer-")
        # PgBouncer refuses to run as root: as the stack's PostgreSQL, it
        # runs as the unprivileged user (deploy/stack.sh's as_pg).
        user = None
        if os.getuid() == 0:
            user = os.environ.get("CHARGED_PG_USER", "postgres")
            pw = pwd.getpwnam(user)
            os.chown(self.dir, pw.pw_uid, pw.pw_gid)
        ini = os.path.join(self.dir, "pgbouncer.ini")
        with open(os.path.join(self.dir, "userlist.txt"), "w") as f:
            f.write('"charged" ""\n')
        with open(ini, "w") as f:
            f.write("""[databases]
* = host=%(host)s port=%(port)d user=charged
[pgbouncer]
listen_addr = 127.0.0.1
listen_port = %(listen)d
unix_socket_dir =
auth_type = trust
auth_file = %(dir)s/userlist.txt
pool_mode = transaction
default_pool_size = %(pool)d
min_pool_size = 0
reserve_pool_size = 0
max_client_conn = 500
; transaction pooling: nothing is reset between clients, as in production
server_reset_query =
logfile = %(dir)s/pgbouncer.log
pidfile = %(dir)s/pgbouncer.pid
admin_users = charged
""" % {"host": target.hostname, "port": target.port or 5432, "listen": self.port,
                "dir": self.dir, "pool": pool_size})
        self.proc = subprocess.Popen([PGBOUNCER, "-q", ini], user=user,
                                     stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT)
        self.admin = "postgresql://charged@127.0.0.1:%d/pgbouncer" % self.port
        e2e.wait_until("PgBouncer on port %d" % self.port, self._up, 20)
        e2e.log("started PgBouncer (transaction pooling, pool_size %d) on port %d"
                % (pool_size, self.port))

    def _up(self):
        if self.proc.poll() is not None:
            raise e2e.Failure("pgbouncer exited %s: %s" % (self.proc.returncode, self.log()[-2000:]))
        p = subprocess.run(["psql", "-X", "-tA", self.admin, "-c", "SHOW VERSION"],
                           capture_output=True)
        return p.returncode == 0

    def url(self, database):
        """The URL of database through this PgBouncer."""
        return "postgresql://charged@127.0.0.1:%d/%s" % (self.port, database)

    def log(self):
        try:
            with open(os.path.join(self.dir, "pgbouncer.log"), errors="replace") as f:
                return f.read()
        except OSError:
            return ""

    def server_sessions(self, database, settings):
        """[(server pid, {setting: value})] of every server session of the
        database's pool, each read in a transaction of its own held open
        until all are read: pool_size clients in a transaction at once take
        every server session the pool has."""
        sessions = []
        try:
            for _ in range(self.pool_size):
                sess = e2e.Session(self.url(database))
                sessions.append(sess)
                sess.run("BEGIN")
                row = sess.run("SELECT pg_backend_pid()::text, " + ", ".join(
                    "current_setting('%s')" % name for name in settings))[0]
                sessions[-1] = (sess, int(row[0]), dict(zip(settings, row[1:])))
            return [(pid, values) for _, pid, values in sessions]
        finally:
            for item in sessions:
                sess = item[0] if isinstance(item, tuple) else item
                try:
                    sess.run("ROLLBACK")
                except Exception:
                    pass
                sess.close()

    def close(self):
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        shutil.rmtree(self.dir, ignore_errors=True)


def wait_log(path, needle, timeout):
    """Until the file at path holds needle."""
    def found():
        try:
            with open(path, errors="replace") as f:
                return needle in f.read()
        except OSError:
            return False
    e2e.wait_until("%r in %s" % (needle, os.path.basename(path)), found, timeout)

