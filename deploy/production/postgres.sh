#!/usr/bin/env bash
# The production profile's PostgreSQL, on loopback: a primary and a
# synchronous standby (PostgreSQL 15, Debian's, as deploy/stack.sh runs),
# streaming replication from pg_basebackup, server TLS with a CA this script
# makes, SCRAM passwords, and PgBouncer (Debian's 1.18) in transaction
# pooling in front of the primary, TLS on both of its sides.
# deploy/stack.sh --profile production calls it; it runs alone as well.
#
#   postgres.sh up                 start all three (a no-op when up); the
#                                  first time, make the CA, the clusters and
#                                  the roles
#   postgres.sh down               stop all three; nothing of them is left
#   postgres.sh status             say what runs, and which node is primary
#   postgres.sh env [ROLE]         print DATABASE_URL (ROLE's: relay, auditor,
#                                  migrate, admin direct; the others through
#                                  PgBouncer) and CHARGED_DATABASE_URL_DIRECT
#   postgres.sh kill-primary       SIGKILL the primary's postmaster and every
#                                  process it started (a host that died)
#   postgres.sh promote            promote the standby (`pg_ctl promote`) and
#                                  point PgBouncer at it (a reload)
#   postgres.sh pgbouncer-restart  stop PgBouncer (SIGINT: at once, as a crash
#                                  of the pooler looks to clients) and start it
#   postgres.sh standby-stop       stop the standby (immediate: a crash)
#   postgres.sh standby-start      start it again
#   postgres.sh standby-async      make the standby asynchronous (the primary
#                                  waits for it no more): what the scenario
#                                  that shows the cost of it needs
#   postgres.sh rejoin             after a promotion, make the old primary
#                                  the new one's synchronous standby (its
#                                  data replaced by a base backup)
#
# Ports: CHARGED_PROD_PG_PORT (55621) is node a's, the first primary; node
# b, the first standby, is +1; PgBouncer +2. State, logs, the CA and the
# passwords: CHARGED_STACK_DIR/production-pg. The OS user the servers and
# PgBouncer run as when we are root: CHARGED_PG_USER (postgres).
#
# The settings and why: docs/operations.md, "Production settings".
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
repo=$(cd "$here/../.." && pwd)
dir=${CHARGED_STACK_DIR:-$repo/.stack}/production-pg
base_port=${CHARGED_PROD_PG_PORT:-55621}
timeout=${CHARGED_STACK_TIMEOUT:-90}
pg_os_user=${CHARGED_PG_USER:-postgres}
pgbin=$(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V | tail -n 1)
pgbouncer=${CHARGED_PGBOUNCER:-$(command -v pgbouncer || echo /usr/sbin/pgbouncer)}
bouncer_port=$((base_port + 2))
tls=$dir/tls

stack_name=production-pg
# die, as_pg, wait_for, tls_ca, tls_cert
# shellcheck source=deploy/lib/stack_common.sh
. "$repo/deploy/lib/stack_common.sh"

node_port() { if [ "$1" = a ]; then echo "$base_port"; else echo $((base_port + 1)); fi; }
other() { if [ "$1" = a ]; then echo b; else echo a; fi; }

# The superuser's psql on a node, over its Unix socket (peer authentication).
psql_node() {
  local node=$1; shift
  as_pg "$pgbin/psql" -X -q -tA -v ON_ERROR_STOP=1 -h "$dir/sock" -p "$(node_port "$node")" \
    -U postgres -d postgres "$@"
}

node_running() {
  [ -f "$dir/$1/postmaster.pid" ] && as_pg "$pgbin/pg_ctl" -D "$dir/$1" status >/dev/null 2>&1
}

node_answers() { as_pg "$pgbin/pg_isready" -q -h "$dir/sock" -p "$(node_port "$1")"; }

# The node that is primary now: the one written down by up and promote.
primary() { cat "$dir/primary"; }

bouncer_pid() {
  local pid
  [ -f "$dir/pgbouncer.pid" ] || return 1
  pid=$(cat "$dir/pgbouncer.pid")
  kill -0 "$pid" 2>/dev/null && grep -q pgbouncer "/proc/$pid/cmdline" 2>/dev/null || return 1
  echo "$pid"
}

# The CA and one server certificate for 127.0.0.1 and localhost, which both
# nodes and PgBouncer present. Clients verify it (sslmode=verify-full).
make_tls() {
  [ -f "$tls/server.crt" ] && return 0
  tls_ca "$tls" "charged production-pg CA"
  tls_cert "$tls" server 127.0.0.1 serverAuth
  [ "$(id -u)" -eq 0 ] && chown "$pg_os_user" "$tls/server.key" "$tls/server.crt"
  chmod 644 "$tls/ca.crt" "$tls/server.crt"
}

# Passwords: generated once. The servers keep SCRAM verifiers; PgBouncer's
# auth_file holds charged's verifier (not the password); clients read the
# password from a libpq passfile named in their URL, so no URL, log or
# environment carries it.
make_secrets() {
  mkdir -p "$dir/secrets"
  chmod 700 "$dir/secrets"
  local u
  for u in charged replicator; do
    [ -s "$dir/secrets/$u" ] || openssl rand -hex 24 >"$dir/secrets/$u"
  done
  chmod 600 "$dir/secrets/"*
  # A passfile for each: the clients' (ours) and the standby's (the OS user).
  {
    echo "127.0.0.1:*:*:charged:$(cat "$dir/secrets/charged")"
  } >"$dir/secrets/pgpass"
  echo "127.0.0.1:*:replication:replicator:$(cat "$dir/secrets/replicator")" \
    >"$dir/replicator.pgpass"
  chmod 600 "$dir/secrets/pgpass" "$dir/replicator.pgpass"
  [ "$(id -u)" -eq 0 ] && chown "$pg_os_user" "$dir/replicator.pgpass"
  return 0
}

# What both nodes run with (included from each node's postgresql.conf, so
# that a promoted standby keeps it). Port and socket come from pg_ctl.
write_common_conf() {
  cat >"$dir/common.conf" <<EOF
listen_addresses = '127.0.0.1'
max_connections = 200
password_encryption = 'scram-sha-256'
ssl = on
ssl_cert_file = '$tls/server.crt'
ssl_key_file = '$tls/server.key'
ssl_ca_file = '$tls/ca.crt'
ssl_min_protocol_version = 'TLSv1.2'
wal_level = replica
max_wal_senders = 5
max_replication_slots = 5
hot_standby = on
# A commit returns once the standby has flushed it to its disk: a failover
# onto it loses nothing the worker was told was committed.
synchronous_commit = on
wal_log_hints = on
recovery_init_sync_method = syncfs
log_connections = off
EOF
}

write_hba() {
  cat >"$dir/$1/pg_hba.conf" <<EOF
# The superuser over the Unix socket only; everything over TCP is TLS and
# SCRAM; plaintext TCP is refused.
local     all          postgres                    peer
hostssl   replication  replicator  127.0.0.1/32    scram-sha-256
hostssl   all          charged     127.0.0.1/32    scram-sha-256
hostnossl all          all         0.0.0.0/0       reject
host      all          all         0.0.0.0/0       reject
EOF
}

start_node() {
  local node=$1
  node_running "$node" && return 0
  as_pg "$pgbin/pg_ctl" -D "$dir/$node" -l "$dir/$node.log" -s \
    -o "-p $(node_port "$node") -k $dir/sock" start >/dev/null 2>&1 || true
  wait_for "PostgreSQL node $node" "$dir/$node.log" node_answers "$node"
}

# Node a: a new cluster, the roles, the database; node b: a copy of it by
# pg_basebackup over TLS, streaming from a's slot as application_name b.
create() {
  local sql
  # --no-sync, -N: a loopback stack is disposable; an OS crash in its first
  # seconds costs an `up` from scratch, not data anyone needs.
  as_pg "$pgbin/initdb" --no-sync -D "$dir/a" -U postgres --auth-local=peer \
    --auth-host=scram-sha-256 -E UTF8 --locale=C >"$dir/initdb.log" 2>&1 ||
    { tail "$dir/initdb.log" >&2; die "initdb failed"; }
  write_hba a
  echo "include '$dir/common.conf'" >>"$dir/a/postgresql.conf"
  # The standby that must confirm every commit (FIRST 1: the one named).
  echo "synchronous_standby_names = 'FIRST 1 (b)'" >>"$dir/a/postgresql.auto.conf"
  echo a >"$dir/primary"
  # Synchronous already: the roles' statements below would wait for a
  # standby that does not exist yet. Local to the setup's session instead.
  start_node a
  sql="SET synchronous_commit = local;
CREATE ROLE replicator REPLICATION LOGIN PASSWORD :'rpw';
CREATE ROLE charged LOGIN CREATEDB PASSWORD :'cpw';
CREATE DATABASE charged OWNER charged;
SELECT pg_create_physical_replication_slot('b');"
  psql_node a -v rpw="$(cat "$dir/secrets/replicator")" -v cpw="$(cat "$dir/secrets/charged")" \
    >/dev/null <<<"$sql"
  as_pg env PGPASSFILE="$dir/replicator.pgpass" "$pgbin/pg_basebackup" -N -D "$dir/b" -X stream -c fast \
    -S b -d "host=127.0.0.1 port=$(node_port a) user=replicator sslmode=verify-full sslrootcert=$tls/ca.crt" \
    >"$dir/basebackup.log" 2>&1 || { tail "$dir/basebackup.log" >&2; die "pg_basebackup failed"; }
  follow b a
}

# Makes node $1 a standby of node $2.
follow() {
  local node=$1 of=$2
  as_pg touch "$dir/$node/standby.signal"
  cat >>"$dir/$node/postgresql.auto.conf" <<EOF
primary_conninfo = 'host=127.0.0.1 port=$(node_port "$of") user=replicator passfile=$dir/replicator.pgpass sslmode=verify-full sslrootcert=$tls/ca.crt application_name=$node'
primary_slot_name = '$node'
synchronous_standby_names = ''
EOF
  [ "$(id -u)" -eq 0 ] && chown "$pg_os_user" "$dir/$node/postgresql.auto.conf"
  return 0
}

# PgBouncer's configuration, pointing at the primary. Transaction pooling:
# charged keeps no state on a session between transactions (common/store/db.c);
# the relay and the auditor, which lead by a session lock, connect direct.
write_bouncer_conf() {
  local p
  p=$(node_port "$(primary)")
  cat >"$dir/pgbouncer.ini.new" <<EOF
[databases]
; every database, by its name, on the primary (promote rewrites this line)
* = host=127.0.0.1 port=$p
[pgbouncer]
listen_addr = 127.0.0.1
listen_port = $bouncer_port
unix_socket_dir = $dir/sock
pool_mode = transaction
auth_type = scram-sha-256
auth_file = $dir/pgbouncer.users
admin_users = postgres
default_pool_size = 20
min_pool_size = 0
reserve_pool_size = 5
max_client_conn = 1000
; charged's statements end at DATABASE_TIMEOUT_MS on the server; a client
; waiting this long for a server session is told so instead of hanging
query_wait_timeout = 30
server_connect_timeout = 3
server_login_retry = 1
; transaction pooling: nothing is reset between clients (server_reset_query
; applies to session pooling only); none of charged's statements needs it
server_reset_query =
client_tls_sslmode = require
client_tls_key_file = $tls/server.key
client_tls_cert_file = $tls/server.crt
client_tls_ca_file = $tls/ca.crt
server_tls_sslmode = verify-full
server_tls_ca_file = $tls/ca.crt
logfile = $dir/pgbouncer.log
pidfile = $dir/pgbouncer.pid
EOF
  mv "$dir/pgbouncer.ini.new" "$dir/pgbouncer.ini"
}

# charged's SCRAM verifier, as the primary keeps it: PgBouncer checks the
# client's proof with it and logs in to the server with the keys the proof
# gives (SCRAM pass-through), so it never holds the password.
write_bouncer_users() {
  local verifier
  verifier=$(psql_node "$(primary)" -c "SELECT rolpassword FROM pg_authid WHERE rolname = 'charged'")
  [ -n "$verifier" ] || die "no SCRAM verifier for role charged on node $(primary)"
  printf '"charged" "%s"\n' "$verifier" >"$dir/pgbouncer.users"
  chmod 600 "$dir/pgbouncer.users"
  [ "$(id -u)" -eq 0 ] && chown "$pg_os_user" "$dir/pgbouncer.users"
  return 0
}

bouncer_answers() {
  # PgBouncer stays up on its Unix socket when the TCP port is taken.
  if grep -q "cannot listen on 127.0.0.1:$bouncer_port" "$dir/pgbouncer.log" 2>/dev/null; then
    stop_bouncer TERM
    die "PgBouncer cannot listen on 127.0.0.1:$bouncer_port: the port is taken"
  fi
  PGPASSFILE=$dir/secrets/pgpass "$pgbin/psql" -X -q -tA \
    "host=127.0.0.1 port=$bouncer_port user=charged dbname=charged sslmode=verify-full sslrootcert=$tls/ca.crt connect_timeout=2" \
    -c "SELECT 1" >/dev/null 2>&1
}

start_bouncer() {
  bouncer_pid >/dev/null && return 0
  [ -x "$pgbouncer" ] || die "pgbouncer not found; run deploy/install-deps.sh"
  write_bouncer_users
  write_bouncer_conf
  [ -f "$dir/pgbouncer.log" ] && mv "$dir/pgbouncer.log" "$dir/pgbouncer.log.old"
  as_pg "$pgbouncer" -d -q "$dir/pgbouncer.ini" >>"$dir/pgbouncer.out" 2>&1 ||
    { tail "$dir/pgbouncer.out" "$dir/pgbouncer.log" >&2 || true; die "pgbouncer did not start"; }
  wait_for PgBouncer "$dir/pgbouncer.log" bouncer_answers
}

stop_bouncer() {
  local pid sig=${1:-TERM}
  pid=$(bouncer_pid) || return 0
  kill "-$sig" "$pid"
  local deadline=$((SECONDS + 15))
  while kill -0 "$pid" 2>/dev/null; do
    [ $SECONDS -lt $deadline ] || { kill -KILL "$pid" 2>/dev/null || true; break; }
    sleep 0.1
  done
}

up() {
  [ -n "$pgbin" ] || die "PostgreSQL binaries not found; run deploy/install-deps.sh"
  mkdir -p "$dir/sock"
  if [ "$(id -u)" -eq 0 ]; then
    chown "$pg_os_user" "$dir" "$dir/sock"
    local d=$dir
    while [ "$d" != / ]; do chmod o+x "$d" 2>/dev/null || true; d=$(dirname "$d"); done
  fi
  make_tls
  make_secrets
  write_common_conf
  if [ ! -f "$dir/a/PG_VERSION" ]; then
    rm -rf "$dir/a" "$dir/b"
    create
  fi
  start_node "$(primary)"
  # Only a standby: after a promotion the old primary's directory is a
  # primary of its own, and started it would take writes beside the new
  # one (the direct URL reaches it when listed first). `rejoin` makes it a
  # standby.
  if [ -f "$dir/$(other "$(primary)")/standby.signal" ]; then
    start_node "$(other "$(primary)")"
  elif [ -f "$dir/$(other "$(primary)")/PG_VERSION" ]; then
    echo "production-pg: node $(other "$(primary)") is the old primary, left stopped: '$0 rejoin' makes it a standby"
  fi
  start_bouncer
  echo "production-pg: up (state, logs, CA and passwords in $dir)"
  echo "  primary node $(primary) on 127.0.0.1:$(node_port "$(primary)"), PgBouncer on 127.0.0.1:$bouncer_port"
  echo "  eval \"\$($0 env)\" exports the roles' URLs"
}

down() {
  stop_bouncer TERM
  local node
  for node in a b; do
    node_running "$node" && as_pg "$pgbin/pg_ctl" -D "$dir/$node" -m fast -w stop >/dev/null 2>&1
  done
  echo "production-pg: down"
}

status() {
  local node role
  for node in a b; do
    if node_running "$node" && node_answers "$node"; then
      role=$(psql_node "$node" -c "SELECT CASE WHEN pg_is_in_recovery() THEN 'standby' ELSE 'primary' END")
      echo "node $node (127.0.0.1:$(node_port "$node")): $role"
    else
      echo "node $node (127.0.0.1:$(node_port "$node")): down"
    fi
  done
  if node_running "$(primary)" && node_answers "$(primary)"; then
    psql_node "$(primary)" -c "SELECT 'replication: ' || application_name || ' ' || state || ' ' || sync_state FROM pg_stat_replication"
  fi
  if bouncer_pid >/dev/null; then
    echo "pgbouncer (127.0.0.1:$bouncer_port): up, to node $(primary)"
  else
    echo "pgbouncer (127.0.0.1:$bouncer_port): down"
  fi
}

# DATABASE_URL per role. Through PgBouncer: the roles with many sessions
# and short transactions (worker, reconciler, api, console, chargectl's
# reads and operations). Direct, to whichever node is primary
# (target_session_attrs=read-write over both): chargectl migrate (DDL,
# long transactions, and a pooler adds nothing to a one-off), the relay
# and the auditor (each leads by a session advisory lock, which needs a
# session of its own: they refuse to lead through a pooler).
print_env() {
  local role=${1:-} tlsq="sslmode=verify-full&sslrootcert=$tls/ca.crt&passfile=$dir/secrets/pgpass"
  local pooled="postgresql://charged@127.0.0.1:$bouncer_port/charged?$tlsq"
  local direct="postgresql://charged@127.0.0.1:$base_port,127.0.0.1:$((base_port + 1))/charged?target_session_attrs=read-write&$tlsq"
  [ -s "$dir/secrets/pgpass" ] || die "no credentials in $dir: run '$0 up' first"
  case $role in
    "" | worker | reconciler | api | console | ctl | orders) ;;
    relay | auditor | migrate | admin) pooled=$direct ;;
    *) die "env: unknown role '$role' (worker reconciler api console ctl orders: through PgBouncer; relay auditor migrate admin: direct)" ;;
  esac
  cat <<EOF
export DATABASE_URL='$pooled'
export CHARGED_DATABASE_URL_DIRECT='$direct'
EOF
  [ -n "$role" ] || echo '# relay, auditor, chargectl migrate: DATABASE_URL="$CHARGED_DATABASE_URL_DIRECT" (or env ROLE)'
}

kill_primary() {
  local node pid children
  node=$(primary)
  [ -f "$dir/$node/postmaster.pid" ] || die "node $node is not running"
  pid=$(head -1 "$dir/$node/postmaster.pid")
  kill -0 "$pid" 2>/dev/null || die "node $node is not running"
  # The postmaster and everything it started, at once: a host that died
  # leaves no backend behind to finish a reply.
  children=$(ps -o pid= --ppid "$pid" || true)
  kill -KILL "$pid" $children 2>/dev/null || true
  local deadline=$((SECONDS + 10))
  while kill -0 "$pid" 2>/dev/null; do
    [ $SECONDS -lt $deadline ] || die "node $node's postmaster $pid survived SIGKILL"
    sleep 0.05
  done
  echo "production-pg: node $node (primary) killed"
}

# pg_ctl promote on the standby, then PgBouncer to it. The new primary
# waits for no standby (synchronous_standby_names cleared): with its peer
# gone, commits would otherwise wait forever. Until a new standby follows
# it (down, remove the old node's directory, up), a loss of this node loses
# what it committed since: docs/operations.md says so.
promote() {
  local old new
  old=$(primary)
  new=$(other "$old")
  node_running "$new" || die "node $new (the standby) is not running"
  [ "$(psql_node "$new" -c "SELECT pg_is_in_recovery()")" = t ] ||
    die "node $new is not a standby"
  as_pg "$pgbin/pg_ctl" -D "$dir/$new" -w -t "$timeout" promote >/dev/null
  as_pg rm -f "$dir/$new/standby.signal"
  psql_node "$new" -c "ALTER SYSTEM SET synchronous_standby_names = ''" \
    -c "SELECT pg_reload_conf()" >/dev/null
  echo "$new" >"$dir/primary"
  # PgBouncer reads its [databases] again on SIGHUP; a database whose host
  # or port changed drops its server sessions as they are released, and
  # new ones go to the new primary.
  if bouncer_pid >/dev/null; then
    write_bouncer_conf
    kill -HUP "$(bouncer_pid)"
  fi
  echo "production-pg: node $new promoted; PgBouncer points at 127.0.0.1:$(node_port "$new")"
}

standby_stop() {
  local node
  node=$(other "$(primary)")
  node_running "$node" || die "node $node (the standby) is not running"
  as_pg "$pgbin/pg_ctl" -D "$dir/$node" -m immediate -w stop >/dev/null
  echo "production-pg: node $node (standby) stopped"
}

# After a promotion: the old primary, stopped, becomes the new primary's
# synchronous standby. What it committed that the new primary lacks (only
# what an asynchronous standby missed) is discarded with its data.
rejoin() {
  local new old
  new=$(primary)
  old=$(other "$new")
  node_running "$new" || die "node $new (the primary) is not running"
  if [ -f "$dir/$old/standby.signal" ]; then
    start_node "$old"
    echo "production-pg: node $old is a standby already"
    return 0
  fi
  node_running "$old" && die "node $old runs as a primary beside node $new: stop it first"
  as_pg rm -rf "$dir/$old"
  psql_node "$new" -c "SELECT pg_create_physical_replication_slot('$old') WHERE NOT EXISTS (SELECT 1 FROM pg_replication_slots WHERE slot_name = '$old')" >/dev/null
  as_pg env PGPASSFILE="$dir/replicator.pgpass" "$pgbin/pg_basebackup" -N -D "$dir/$old" -X stream -c fast \
    -S "$old" -d "host=127.0.0.1 port=$(node_port "$new") user=replicator sslmode=verify-full sslrootcert=$tls/ca.crt" \
    >"$dir/basebackup.log" 2>&1 || { tail "$dir/basebackup.log" >&2; die "pg_basebackup failed"; }
  follow "$old" "$new"
  start_node "$old"
  psql_node "$new" -c "ALTER SYSTEM SET synchronous_standby_names = 'FIRST 1 ($old)'" \
    -c "SELECT pg_reload_conf()" >/dev/null
  echo "production-pg: node $old is node $new's synchronous standby"
}

standby_async() {
  psql_node "$(primary)" -c "ALTER SYSTEM SET synchronous_standby_names = ''" \
    -c "SELECT pg_reload_conf()" >/dev/null
  echo "production-pg: node $(other "$(primary)") is an asynchronous standby now"
}

case "${1:-}" in
  up) up ;;
  down) down ;;
  status) status ;;
  env) print_env "${2:-}" ;;
  kill-primary) kill_primary ;;
  promote) promote ;;
  pgbouncer-restart) stop_bouncer INT; start_bouncer; echo "production-pg: PgBouncer restarted" ;;
  standby-stop) standby_stop ;;
  standby-start) start_node "$(other "$(primary)")"; echo "production-pg: node $(other "$(primary)") (standby) started" ;;
  standby-async) standby_async ;;
  rejoin) rejoin ;;
  *) echo "usage: $0 up|down|status|env|kill-primary|promote|pgbouncer-restart|standby-stop|standby-start|standby-async|rejoin" >&2; exit 2 ;;
esac
