#!/usr/bin/env bash
# The local stack: a private PostgreSQL cluster and a single-node Apache Kafka
# (KRaft, broker and controller in one JVM), both on loopback.
#
#   deploy/stack.sh up       start both (a no-op when already up), create the
#                            database and the contract's topics
#   deploy/stack.sh down     stop both; no process of the stack is left
#   deploy/stack.sh status   say what runs
#   deploy/stack.sh env      print the environment that reaches the stack
#
# The production profile (issue 39), `--profile production` after up, down,
# status or env: deploy/production/kafka.sh's three SASL_SSL brokers with
# per-role ACLs, and deploy/production/postgres.sh's PostgreSQL when that
# script exists. `env --profile production [ROLE]` prints ROLE's environment
# (worker by default; deploy/production/kafka.sh names the roles).
#
# Faults, for tests that take a part of the stack away and bring it back:
#
#   deploy/stack.sh kafka-kill         SIGKILL the broker's JVM; return once it is gone
#   deploy/stack.sh kafka-start        start the broker again; return once it answers
#   deploy/stack.sh pg-stop-immediate  stop PostgreSQL with `pg_ctl -m immediate`
#                                      (no checkpoint: a crash, recovered at start)
#   deploy/stack.sh pg-start           start PostgreSQL again; return once it accepts
#                                      connections (a frozen one is thawed first)
#   deploy/stack.sh pg-freeze          SIGSTOP the postmaster and every process it
#                                      started: TCP stays open, nothing answers
#   deploy/stack.sh pg-thaw            SIGCONT them all: they go on where they were
#
# Overrides: CHARGED_STACK_DIR (state, logs; default <repo>/.stack),
# CHARGED_PG_PORT (55432), CHARGED_KAFKA_PORT (9092),
# CHARGED_KAFKA_CONTROLLER_PORT (9093), CHARGED_KAFKA_HEAP (512m),
# CHARGED_KAFKA_VERSION (deploy/kafka/pom.xml's kafka.version; "compat" for
# its kafka.compat.version), CHARGED_KAFKA_JARS (a directory of Kafka's jars
# to use instead of fetching that version), CHARGED_STACK_TIMEOUT (90 s),
# CHARGED_PG_USER (the OS user PostgreSQL runs as when we are root: postgres).
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
repo=$(cd "$here/.." && pwd)
dir=${CHARGED_STACK_DIR:-$repo/.stack}
pg_port=${CHARGED_PG_PORT:-55432}
kafka_port=${CHARGED_KAFKA_PORT:-9092}
controller_port=${CHARGED_KAFKA_CONTROLLER_PORT:-9093}
heap=${CHARGED_KAFKA_HEAP:-512m}
# CHARGED_KAFKA_JARS, when set, is a directory of jars used as it is.
jars=${CHARGED_KAFKA_JARS:-}
kafka_version=${CHARGED_KAFKA_VERSION:-}
timeout=${CHARGED_STACK_TIMEOUT:-90}
pg_os_user=${CHARGED_PG_USER:-postgres}
pgbin=$(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V | tail -n 1)
bootstrap=127.0.0.1:$kafka_port
database_url="postgresql://charged@127.0.0.1:$pg_port/charged"

commands_topic=${CHARGE_COMMANDS_TOPIC:-payments.charge.commands}
results_topic=${CHARGE_RESULTS_TOPIC:-payments.charge.results}
dlq_topic=${CHARGE_DLQ_TOPIC:-payments.charge.commands.dlq}

stack_name=stack
# die, as_pg, wait_for
# shellcheck source=deploy/lib/stack_common.sh
. "$here/lib/stack_common.sh"

pg_running() {
  [ -f "$dir/pg/postmaster.pid" ] && as_pg "$pgbin/pg_ctl" -D "$dir/pg" status >/dev/null 2>&1
}

kafka_pid() {
  local pid
  [ -f "$dir/kafka.pid" ] || return 1
  pid=$(cat "$dir/kafka.pid")
  kill -0 "$pid" 2>/dev/null && grep -q kafka.Kafka "/proc/$pid/cmdline" 2>/dev/null || return 1
  echo "$pid"
}

# kafka_jars: fetches the jars of the Kafka this stack runs and writes its
# logging configuration: Kafka 4.x logs through log4j 2, 3.x through reload4j.
kafka_jars() {
  [ -n "$jars" ] || jars=$("$here/kafka/fetch-jars.sh" $kafka_version)
  if compgen -G "$jars/log4j-core-*.jar" >/dev/null; then
    cat >"$dir/kafka-log4j2.properties" <<EOF
status = warn
appender.file.type = File
appender.file.name = file
appender.file.fileName = $dir/kafka.log
appender.file.layout.type = PatternLayout
appender.file.layout.pattern = [%d] %p %m (%c)%n
rootLogger.level = info
rootLogger.appenderRef.file.ref = file
logger.request.name = kafka.request.logger
logger.request.level = warn
EOF
    kafka_log_opts=("-Dlog4j2.configurationFile=$dir/kafka-log4j2.properties")
  else
    cat >"$dir/kafka-log4j.properties" <<EOF
log4j.rootLogger=INFO, file
log4j.appender.file=org.apache.log4j.FileAppender
log4j.appender.file.File=$dir/kafka.log
log4j.appender.file.layout=org.apache.log4j.PatternLayout
log4j.appender.file.layout.ConversionPattern=[%d] %p %m (%c)%n
log4j.logger.kafka.request.logger=WARN
log4j.logger.org.apache.kafka.controller=INFO
EOF
    kafka_log_opts=("-Dlog4j.configuration=file:$dir/kafka-log4j.properties")
  fi
}

kafka_answers() {
  kcat -L -b "$bootstrap" -m 5 >/dev/null 2>&1
}

pg_up() {
  [ -n "$pgbin" ] || die "PostgreSQL binaries not found; run deploy/install-deps.sh"
  # A frozen cluster looks running to pg_ctl: let it answer again.
  pg_thaw >/dev/null
  mkdir -p "$dir"
  if [ "$(id -u)" -eq 0 ]; then
    chown "$pg_os_user" "$dir"
    # The cluster's user must be able to reach its directory.
    local d=$dir
    while [ "$d" != / ]; do chmod o+x "$d" 2>/dev/null || true; d=$(dirname "$d"); done
  fi
  if pg_running; then
    return 0
  fi
  if [ ! -f "$dir/pg/PG_VERSION" ]; then
    rm -rf "$dir/pg"
    as_pg "$pgbin/initdb" -D "$dir/pg" -U postgres --auth=trust -E UTF8 --locale=C \
      >"$dir/initdb.log" 2>&1 || { tail "$dir/initdb.log" >&2; die "initdb failed"; }
  fi
  mkdir -p "$dir/pgsock"
  [ "$(id -u)" -eq 0 ] && chown "$pg_os_user" "$dir/pgsock"
  # pg_stat_statements (contrib, shipped in Debian's postgresql-NN package):
  # bench/throughput.py reads the statements' time, calls and WAL from it.
  # It only loads at server start; a cluster started before this line keeps
  # running without it until `deploy/stack.sh down && deploy/stack.sh up`.
  # recovery_init_sync_method=syncfs: after a crash (the tests stop it
  # immediately), one syncfs(2) of the file system instead of an fsync of
  # every file of every database the tests made: 90 s of a start otherwise.
  as_pg "$pgbin/pg_ctl" -D "$dir/pg" -l "$dir/postgres.log" -s \
    -o "-p $pg_port -k $dir/pgsock -c listen_addresses=127.0.0.1 -c max_connections=200 \
-c shared_preload_libraries=pg_stat_statements -c pg_stat_statements.track=all \
-c recovery_init_sync_method=syncfs" \
    start >/dev/null 2>&1 || true
  wait_for PostgreSQL "$dir/postgres.log" "$pgbin/pg_isready" -q -h 127.0.0.1 -p "$pg_port"
  local psql=("$pgbin/psql" -X -q -h 127.0.0.1 -p "$pg_port" -U postgres -d postgres -v ON_ERROR_STOP=1)
  if [ -z "$("${psql[@]}" -tAc "SELECT 1 FROM pg_roles WHERE rolname = 'charged'")" ]; then
    "${psql[@]}" -c "CREATE ROLE charged LOGIN CREATEDB"
  fi
  if [ -z "$("${psql[@]}" -tAc "SELECT 1 FROM pg_database WHERE datname = 'charged'")" ]; then
    "${psql[@]}" -c "CREATE DATABASE charged OWNER charged"
  fi
}

kafka_up() {
  mkdir -p "$dir"
  kafka_jars
  if ! kafka_pid >/dev/null; then
    cat >"$dir/kafka.properties" <<EOF
process.roles=broker,controller
node.id=1
controller.quorum.voters=1@127.0.0.1:$controller_port
listeners=PLAINTEXT://127.0.0.1:$kafka_port,CONTROLLER://127.0.0.1:$controller_port
advertised.listeners=PLAINTEXT://127.0.0.1:$kafka_port
controller.listener.names=CONTROLLER
inter.broker.listener.name=PLAINTEXT
listener.security.protocol.map=PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT
log.dirs=$dir/kafka-data
auto.create.topics.enable=false
offsets.topic.replication.factor=1
offsets.topic.num.partitions=12
transaction.state.log.replication.factor=1
transaction.state.log.min.isr=1
group.initial.rebalance.delay.ms=0
# KIP-848's consumer protocol (group.protocol=consumer): the broker owns the
# session and heartbeat timing; short here, as the classic clients' are in
# the tests, so that a member that dies is noticed within seconds.
group.consumer.min.session.timeout.ms=3000
group.consumer.session.timeout.ms=6000
group.consumer.min.heartbeat.interval.ms=500
group.consumer.heartbeat.interval.ms=1000
message.max.bytes=4194304
EOF
    local java_opts=(-Xms256m "-Xmx$heap" -XX:+UseG1GC -Djava.awt.headless=true)
    java_opts+=("${kafka_log_opts[@]}")
    # Data written by a newer Kafka does not start an older one (its
    # metadata version is too high): say so instead of a broker that dies.
    local running
    running=$(cd "$jars" && ls kafka_2.13-*.jar 2>/dev/null | sed -n 's/^kafka_2\.13-\(.*\)\.jar$/\1/p' | head -1)
    [ -n "$running" ] || die "no kafka_2.13-<version>.jar in $jars"
    if [ -f "$dir/kafka-data/meta.properties" ] && [ -f "$dir/kafka-version" ] &&
      [ "$(cat "$dir/kafka-version")" != "$running" ]; then
      die "the Kafka data in $dir was written by Kafka $(cat "$dir/kafka-version"), not $running: \
run that version, or 'deploy/stack.sh down' and remove $dir/kafka-data"
    fi
    echo "$running" >"$dir/kafka-version"
    if [ ! -f "$dir/kafka-data/meta.properties" ]; then
      local cluster_id
      cluster_id=$(java "${java_opts[@]}" -cp "$jars/*" kafka.tools.StorageTool random-uuid)
      java "${java_opts[@]}" -cp "$jars/*" kafka.tools.StorageTool format \
        -t "$cluster_id" -c "$dir/kafka.properties" >"$dir/kafka-format.log" 2>&1 ||
        { cat "$dir/kafka-format.log" >&2; die "formatting Kafka's storage failed"; }
    fi
    setsid nohup java "${java_opts[@]}" -cp "$jars/*" kafka.Kafka "$dir/kafka.properties" \
      >"$dir/kafka.out" 2>&1 </dev/null &
    echo $! >"$dir/kafka.pid"
  fi
  wait_for Kafka "$dir/kafka.log" kafka_answers
  local have
  have=$(kcat -L -b "$bootstrap" -m 10 2>/dev/null | sed -n 's/^  topic "\([^"]*\)".*/\1/p')
  create_topic "$have" "$commands_topic" 12
  create_topic "$have" "$results_topic" 12
  create_topic "$have" "$dlq_topic" 3
}

create_topic() {
  local have=$1 topic=$2 partitions=$3
  grep -qx "$topic" <<<"$have" && return 0
  java -Xmx256m "${kafka_log_opts[@]}" -cp "$jars/*" \
    org.apache.kafka.tools.TopicCommand --bootstrap-server "$bootstrap" --create \
    --if-not-exists --topic "$topic" --partitions "$partitions" --replication-factor 1 \
    --config max.message.bytes=4194304 >>"$dir/topics.log" 2>&1 ||
    { tail "$dir/topics.log" >&2; die "creating topic $topic failed"; }
}

print_env() {
  cat <<EOF
export DATABASE_URL='$database_url'
export KAFKA_BOOTSTRAP_SERVERS='$bootstrap'
export CHARGE_COMMANDS_TOPIC='$commands_topic'
export CHARGE_RESULTS_TOPIC='$results_topic'
export CHARGE_DLQ_TOPIC='$dlq_topic'
EOF
}

up() {
  pg_up
  kafka_up
  echo "stack: up (state and logs in $dir)"
  echo "  PostgreSQL: psql '$database_url'"
  echo "  Kafka:      kcat -L -b $bootstrap"
  echo "  eval \"\$($0 env)\" exports both for charged"
}

down() {
  local pid
  if pid=$(kafka_pid); then
    kill "$pid" 2>/dev/null || true
    local deadline=$((SECONDS + 30))
    while kill -0 "$pid" 2>/dev/null && [ $SECONDS -lt $deadline ]; do sleep 0.2; done
    kill -9 "$pid" 2>/dev/null || true
    while kill -0 "$pid" 2>/dev/null; do sleep 0.1; done
  fi
  rm -f "$dir/kafka.pid"
  if [ -f "$dir/pg/postmaster.pid" ]; then
    pg_thaw >/dev/null # a stopped postmaster would not act on pg_ctl's signal
    as_pg "$pgbin/pg_ctl" -D "$dir/pg" -m fast -w -s stop >/dev/null 2>&1 || true
    if [ -f "$dir/pg/postmaster.pid" ]; then
      pid=$(head -n 1 "$dir/pg/postmaster.pid")
      kill -9 "$pid" 2>/dev/null || true
    fi
  fi
  echo "stack: down"
}

status() {
  local rc=0
  if pg_running; then echo "postgresql: up on 127.0.0.1:$pg_port"; else echo "postgresql: down"; rc=1; fi
  if kafka_pid >/dev/null && kafka_answers; then echo "kafka: up on $bootstrap"; else echo "kafka: down"; rc=1; fi
  return $rc
}

# kafka-kill: SIGKILL the broker (no controlled shutdown, no log flush), as a
# crashed machine would; returns once the process is gone.
kafka_kill() {
  local pid
  if pid=$(kafka_pid); then
    kill -9 "$pid" 2>/dev/null || true
    local deadline=$((SECONDS + 30))
    # Gone, or a zombie that its (new) parent has not reaped yet.
    while kill -0 "$pid" 2>/dev/null && [ "$(awk '{print $3}' "/proc/$pid/stat" 2>/dev/null)" != Z ]; do
      [ $SECONDS -lt $deadline ] || die "Kafka (pid $pid) still runs 30s after SIGKILL"
      sleep 0.1
    done
    echo "stack: kafka killed (pid $pid)"
  else
    echo "stack: kafka was not running"
  fi
  rm -f "$dir/kafka.pid"
}

# pg-stop-immediate: every PostgreSQL process exits at once without a
# checkpoint; the next start runs crash recovery.
pg_stop_immediate() {
  if pg_running; then
    as_pg "$pgbin/pg_ctl" -D "$dir/pg" -m immediate -w -t "$timeout" -s stop >/dev/null 2>&1 ||
      die "pg_ctl -m immediate stop failed; see $dir/postgres.log"
    echo "stack: postgresql stopped (immediate)"
  else
    echo "stack: postgresql was not running"
  fi
}

# The postmaster's pid, when its pid file names a live process.
postmaster_pid() {
  local pid
  [ -f "$dir/pg/postmaster.pid" ] || return 1
  pid=$(head -n 1 "$dir/pg/postmaster.pid")
  [ -n "$pid" ] && kill -0 "$pid" 2>/dev/null || return 1
  echo "$pid"
}

# pg-freeze: SIGSTOP on the postmaster, then on every process it started
# (backends, checkpointer, walwriter...), as a host that hangs would leave
# them: the kernel still accepts connections and acknowledges what clients
# send, but nothing answers. Returns once every one of them is stopped.
pg_freeze() {
  local pid children c deadline
  pid=$(postmaster_pid) || die "postgresql is not running"
  # The postmaster first, so that it starts no process we would miss.
  kill -STOP "$pid"
  children=$(pgrep -P "$pid" || true)
  for c in $children; do kill -STOP "$c" 2>/dev/null || true; done
  deadline=$((SECONDS + 30))
  # Stopped, or gone: one that was exiting stays a zombie (Z), which the
  # stopped postmaster does not reap.
  for c in $pid $children; do
    while [ -e "/proc/$c" ] && ! [[ "$(awk '{print $3}' "/proc/$c/stat" 2>/dev/null)" =~ ^[TtZX]?$ ]]; do
      [ $SECONDS -lt $deadline ] || die "postgresql process $c not stopped 30s after SIGSTOP"
      sleep 0.05
    done
  done
  echo "stack: postgresql frozen (postmaster $pid and $(wc -w <<<"$children") processes)"
}

# pg-thaw: SIGCONT on them all; a no-op on a cluster that is not frozen.
pg_thaw() {
  local pid c
  if ! pid=$(postmaster_pid); then
    echo "stack: postgresql is not running"
    return 0
  fi
  for c in $(pgrep -P "$pid" || true); do kill -CONT "$c" 2>/dev/null || true; done
  kill -CONT "$pid"
  echo "stack: postgresql thawed"
}

# --profile NAME may come anywhere after the command.
profile=default
args=()
while [ $# -gt 0 ]; do
  case $1 in
    --profile) [ $# -ge 2 ] || die "--profile needs a name (default, production)"; profile=$2; shift 2 ;;
    --profile=*) profile=${1#--profile=}; shift ;;
    *) args+=("$1"); shift ;;
  esac
done
set -- "${args[@]}"

production() {
  local cmd=${1:-} pg=$here/production/postgres.sh
  case $cmd in
    up | down | status)
      local rc=0
      if [ -x "$pg" ]; then "$pg" "$cmd" || rc=$?; fi
      "$here/production/kafka.sh" "$cmd" || rc=$?
      return $rc ;;
    env)
      local role=${2:-worker}
      if [ -x "$pg" ]; then "$pg" env "$role"; fi
      case $role in
        # PostgreSQL (and the provider) only: no Kafka principal.
        reconciler | api | auditor | migrate) ;;
        *) "$here/production/kafka.sh" env "$role" ;;
      esac ;;
    *) echo "usage: $0 up|down|status|env [ROLE] --profile production" >&2; exit 2 ;;
  esac
}

case $profile in
  default) ;;
  production) production "$@"; exit $? ;;
  *) die "unknown profile '$profile' (default, production)" ;;
esac

case "${1:-}" in
  up) up ;;
  down) down ;;
  status) status ;;
  env) print_env ;;
  kafka-kill) kafka_kill ;;
  kafka-start) kafka_up; echo "stack: kafka up on $bootstrap" ;;
  pg-stop-immediate) pg_stop_immediate ;;
  pg-start) pg_up; echo "stack: postgresql up on 127.0.0.1:$pg_port" ;;
  pg-freeze) pg_freeze ;;
  pg-thaw) pg_thaw ;;
  *) echo "usage: $0 up|down|status|env|kafka-kill|kafka-start|pg-stop-immediate|pg-start|pg-freeze|pg-thaw" >&2; exit 2 ;;
esac
