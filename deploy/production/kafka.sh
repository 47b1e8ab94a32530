#!/usr/bin/env bash
# The production-shaped Kafka (issue 39): three KRaft nodes on loopback, each
# broker and controller in one JVM, TLS from a CA this script makes, SCRAM
# principals, one per role, the StandardAuthorizer with per-role ACLs.
#
#   deploy/production/kafka.sh up         start the three nodes (a no-op when
#                                         up), create the contract's topics at
#                                         replication factor 3, grant the ACLs
#   deploy/production/kafka.sh down       stop them; no process is left
#   deploy/production/kafka.sh status     say which node answers
#   deploy/production/kafka.sh env ROLE   the environment that reaches the
#                                         stack as ROLE (worker, relay, ctl,
#                                         console, orders, admin)
#   deploy/production/kafka.sh provision  create the topics named by
#                                         CHARGE_*_TOPIC and grant the roles
#                                         their ACLs on them and on the groups
#                                         CHARGED_PROD_WORKER_GROUP and
#                                         CHARGED_PROD_ORDERS_GROUP (what `up`
#                                         does for the defaults; tests give
#                                         their own names)
#   deploy/production/kafka.sh revoke ROLE RESOURCE-TYPE NAME OPERATION
#                                         remove one ACL (tests: a revoked
#                                         permission), e.g. worker group
#                                         charged-worker Read
#   deploy/production/kafka.sh grant ROLE RESOURCE-TYPE NAME OPERATION
#                                         add one ACL (the same, back)
#   deploy/production/kafka.sh leader TOPIC PARTITION
#                                         the node that leads that partition
#   deploy/production/kafka.sh coordinator GROUP
#                                         the node that coordinates that group
#   deploy/production/kafka.sh kill N     SIGKILL node N (1..3)
#   deploy/production/kafka.sh start      start the nodes that are down
#
# Ports (CHARGED_PROD_KAFKA_PORT, default 19611; P is that value):
#   P, P+1, P+2    client listeners (SASL_SSL, SCRAM-SHA-512) of nodes 1..3
#   P+3, P+4, P+5  controller listeners (SASL_SSL, PLAIN: see below)
#   P+6, P+7, P+8  inter-broker listeners (SASL_SSL, SCRAM-SHA-512)
# The controller listener uses PLAIN over TLS: SCRAM credentials live in the
# metadata log that the controllers themselves serve, so the quorum cannot
# authenticate with them; PLAIN's one user (the admin) is in the nodes'
# JAAS configuration instead.
#
# State, secrets and logs go to $CHARGED_STACK_DIR/kafka-prod (default
# <repo>/.stack/kafka-prod). Passwords are generated there (mode 600) and
# printed only by `env ROLE`. Other overrides: CHARGED_PROD_KAFKA_HEAP (384m),
# CHARGED_KAFKA_JARS, CHARGED_KAFKA_VERSION, CHARGED_STACK_TIMEOUT (120 s),
# CHARGE_COMMANDS_TOPIC, CHARGE_RESULTS_TOPIC, CHARGE_DLQ_TOPIC,
# CHARGED_PROD_WORKER_GROUP (charged-worker), CHARGED_PROD_ORDERS_GROUP
# (order-service).
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
repo=$(cd "$here/../.." && pwd)
dir=${CHARGED_STACK_DIR:-$repo/.stack}/kafka-prod
base_port=${CHARGED_PROD_KAFKA_PORT:-19611}
heap=${CHARGED_PROD_KAFKA_HEAP:-384m}
jars=${CHARGED_KAFKA_JARS:-}
kafka_version=${CHARGED_KAFKA_VERSION:-}
timeout=${CHARGED_STACK_TIMEOUT:-120}
commands_topic=${CHARGE_COMMANDS_TOPIC:-payments.charge.commands}
results_topic=${CHARGE_RESULTS_TOPIC:-payments.charge.results}
dlq_topic=${CHARGE_DLQ_TOPIC:-payments.charge.commands.dlq}
worker_group=${CHARGED_PROD_WORKER_GROUP:-charged-worker}
orders_group=${CHARGED_PROD_ORDERS_GROUP:-order-service}
roles=(admin worker relay ctl console orders)
nodes=(1 2 3)

stack_name=kafka-prod
# die, wait_for, tls_ca, tls_cert
# shellcheck source=deploy/lib/stack_common.sh
. "$repo/deploy/lib/stack_common.sh"

client_port() { echo $((base_port + $1 - 1)); }
controller_port() { echo $((base_port + $1 + 2)); }
broker_port() { echo $((base_port + $1 + 5)); }
bootstrap() { echo "127.0.0.1:$(client_port 1),127.0.0.1:$(client_port 2),127.0.0.1:$(client_port 3)"; }
principal() { echo "charged-$1"; }
password() { cat "$dir/secrets/$1.password"; }

valid_role() {
  local r
  for r in "${roles[@]}"; do [ "$r" = "$1" ] && return 0; done
  die "unknown role '$1' (one of: ${roles[*]})"
}

node_pid() {
  local pid f=$dir/node$1/kafka.pid
  [ -f "$f" ] || return 1
  pid=$(cat "$f")
  kill -0 "$pid" 2>/dev/null && grep -q kafka.Kafka "/proc/$pid/cmdline" 2>/dev/null || return 1
  echo "$pid"
}

kafka_jars() {
  [ -n "$jars" ] || jars=$("$repo/deploy/kafka/fetch-jars.sh" $kafka_version)
  compgen -G "$jars/log4j-core-*.jar" >/dev/null ||
    die "$jars: no log4j 2 (Kafka 4.x is required for this profile)"
  cat >"$dir/tools-log4j2.properties" <<EOF
status = warn
appender.console.type = Console
appender.console.name = console
appender.console.target = SYSTEM_ERR
appender.console.layout.type = PatternLayout
appender.console.layout.pattern = %p %m%n
rootLogger.level = warn
rootLogger.appenderRef.console.ref = console
EOF
  java_tool=(java -Xmx256m "-Dlog4j2.configurationFile=$dir/tools-log4j2.properties" -cp "$jars/*")
}

# secrets: a password per role, the keystores' password; made once.
secrets() {
  mkdir -p "$dir/secrets"
  chmod 700 "$dir/secrets"
  local r
  for r in "${roles[@]}" keystore; do
    if [ ! -s "$dir/secrets/$r.password" ]; then
      (umask 077 && openssl rand -hex 24 >"$dir/secrets/$r.password")
    fi
  done
}

# tls: a CA, and per node a key and a certificate for 127.0.0.1/localhost,
# in a PKCS12 keystore; clients trust ca.crt (PEM).
tls() {
  local t=$dir/tls n
  tls_ca "$t" "charged production-profile CA"
  for n in "${nodes[@]}"; do
    [ -s "$t/node$n.p12" ] && continue
    tls_cert "$t" "node$n" "kafka-node$n" serverAuth,clientAuth
    (umask 077 && openssl pkcs12 -export -in "$t/node$n.crt" -inkey "$t/node$n.key" \
      -certfile "$t/ca.crt" -name "node$n" -passout "file:$dir/secrets/keystore.password" \
      -out "$t/node$n.p12")
  done
}

# client_files: per role, a Java client properties file and a kcat/librdkafka
# one (both mode 600: they hold the password).
client_files() {
  local r
  mkdir -p "$dir/clients"
  chmod 700 "$dir/clients"
  for r in "${roles[@]}"; do
    (umask 077 && cat >"$dir/clients/$r.properties" <<EOF
security.protocol=SASL_SSL
sasl.mechanism=SCRAM-SHA-512
sasl.jaas.config=org.apache.kafka.common.security.scram.ScramLoginModule required username="$(principal "$r")" password="$(password "$r")";
ssl.truststore.type=PEM
ssl.truststore.location=$dir/tls/ca.crt
EOF
    )
    (umask 077 && cat >"$dir/clients/$r.librdkafka.conf" <<EOF
bootstrap.servers=$(bootstrap)
security.protocol=SASL_SSL
sasl.mechanisms=SCRAM-SHA-512
sasl.username=$(principal "$r")
sasl.password=$(password "$r")
ssl.ca.location=$dir/tls/ca.crt
EOF
    )
  done
}

node_config() {
  local n=$1 admin_pw keystore_pw voters="" i
  admin_pw=$(password admin)
  keystore_pw=$(password keystore)
  for i in "${nodes[@]}"; do voters+="${voters:+,}$i@127.0.0.1:$(controller_port "$i")"; done
  mkdir -p "$dir/node$n"
  (umask 077 && cat >"$dir/node$n/server.properties" <<EOF
process.roles=broker,controller
node.id=$n
controller.quorum.voters=$voters
listeners=CLIENT://127.0.0.1:$(client_port "$n"),BROKER://127.0.0.1:$(broker_port "$n"),CONTROLLER://127.0.0.1:$(controller_port "$n")
advertised.listeners=CLIENT://127.0.0.1:$(client_port "$n"),BROKER://127.0.0.1:$(broker_port "$n")
listener.security.protocol.map=CLIENT:SASL_SSL,BROKER:SASL_SSL,CONTROLLER:SASL_SSL
inter.broker.listener.name=BROKER
controller.listener.names=CONTROLLER
sasl.mechanism.inter.broker.protocol=SCRAM-SHA-512
sasl.mechanism.controller.protocol=PLAIN
listener.name.client.sasl.enabled.mechanisms=SCRAM-SHA-512
listener.name.broker.sasl.enabled.mechanisms=SCRAM-SHA-512
listener.name.controller.sasl.enabled.mechanisms=PLAIN
listener.name.client.scram-sha-512.sasl.jaas.config=org.apache.kafka.common.security.scram.ScramLoginModule required;
listener.name.broker.scram-sha-512.sasl.jaas.config=org.apache.kafka.common.security.scram.ScramLoginModule required username="charged-admin" password="$admin_pw";
listener.name.controller.plain.sasl.jaas.config=org.apache.kafka.common.security.plain.PlainLoginModule required username="charged-admin" password="$admin_pw" user_charged-admin="$admin_pw";
ssl.keystore.type=PKCS12
ssl.keystore.location=$dir/tls/node$n.p12
ssl.keystore.password=$keystore_pw
ssl.key.password=$keystore_pw
ssl.truststore.type=PEM
ssl.truststore.location=$dir/tls/ca.crt
authorizer.class.name=org.apache.kafka.metadata.authorizer.StandardAuthorizer
super.users=User:charged-admin
allow.everyone.if.no.acl.found=false
log.dirs=$dir/node$n/data
auto.create.topics.enable=false
default.replication.factor=3
min.insync.replicas=2
unclean.leader.election.enable=false
offsets.topic.replication.factor=3
offsets.topic.num.partitions=12
transaction.state.log.replication.factor=3
transaction.state.log.min.isr=2
group.initial.rebalance.delay.ms=0
group.consumer.min.session.timeout.ms=3000
group.consumer.session.timeout.ms=6000
group.consumer.min.heartbeat.interval.ms=500
group.consumer.heartbeat.interval.ms=1000
message.max.bytes=4194304
EOF
  )
  cat >"$dir/node$n/log4j2.properties" <<EOF
status = warn
appender.file.type = File
appender.file.name = file
appender.file.fileName = $dir/node$n/kafka.log
appender.file.layout.type = PatternLayout
appender.file.layout.pattern = [%d] %p %m (%c)%n
rootLogger.level = info
rootLogger.appenderRef.file.ref = file
logger.request.name = kafka.request.logger
logger.request.level = warn
EOF
}

format_nodes() {
  local n cluster_id scram=()
  [ -f "$dir/node1/data/meta.properties" ] && return 0
  for r in "${roles[@]}"; do
    scram+=(--add-scram "SCRAM-SHA-512=[name=$(principal "$r"),password=$(password "$r")]")
  done
  cluster_id=$("${java_tool[@]}" kafka.tools.StorageTool random-uuid)
  for n in "${nodes[@]}"; do
    # The credentials go in the first metadata records: the brokers need
    # the admin's to talk to each other before anyone could add them.
    "${java_tool[@]}" kafka.tools.StorageTool format -t "$cluster_id" \
      -c "$dir/node$n/server.properties" "${scram[@]}" >"$dir/node$n/format.log" 2>&1 ||
      { cat "$dir/node$n/format.log" >&2; die "formatting node $n's storage failed"; }
  done
}

start_node() {
  local n=$1
  node_pid "$n" >/dev/null && return 0
  setsid nohup java -Xms128m "-Xmx$heap" -XX:+UseG1GC -Djava.awt.headless=true \
    "-Dlog4j2.configurationFile=$dir/node$n/log4j2.properties" -cp "$jars/*" \
    kafka.Kafka "$dir/node$n/server.properties" >"$dir/node$n/kafka.out" 2>&1 </dev/null &
  echo $! >"$dir/node$n/kafka.pid"
}

# The brokers that answer, one "127.0.0.1:PORT (id: N rack: ...) -> (...)"
# line each, as Kafka's own client sees them (kcat's bundled librdkafka 2.0
# fails SCRAM against Kafka 4: fixed in librdkafka 2.6.1).
api_versions() {
  timeout 60 "${java_tool[@]}" org.apache.kafka.tools.BrokerApiVersionsCommand \
    --bootstrap-server "${1:-$(bootstrap)}" --command-config "$dir/clients/admin.properties" \
    2>/dev/null | grep -E '^127\.0\.0\.1:[0-9]+ \(id: [0-9]+ ' || true
}

# Each node's client port takes a connection: checked first, without a JVM
# (api_versions starts one a try, seconds of CPU, three times a second while
# a node starts: on a loaded machine that slowed everything beside it).
ports_listen() {
  local n
  for n in "${nodes[@]}"; do
    (exec 3<>"/dev/tcp/127.0.0.1/$(client_port "$n")") 2>/dev/null || return 1
  done
}

# All three registered: metadata from one lists three brokers.
cluster_answers() {
  ports_listen && [ "$(api_versions | grep -c ' -> (')" -eq 3 ]
}

start() {
  local n
  kafka_jars
  for n in "${nodes[@]}"; do start_node "$n"; done
  wait_for "the three-node cluster" "$dir/node1/kafka.log" cluster_answers
}

create_topic() {
  local have=$1 topic=$2 partitions=$3
  grep -qx "$topic" <<<"$have" && return 0
  "${java_tool[@]}" org.apache.kafka.tools.TopicCommand --bootstrap-server "$(bootstrap)" \
    --command-config "$dir/clients/admin.properties" --create --if-not-exists \
    --topic "$topic" --partitions "$partitions" --replication-factor 3 \
    --config min.insync.replicas=2 --config unclean.leader.election.enable=false \
    --config max.message.bytes=4194304 >>"$dir/topics.log" 2>&1 ||
    { tail "$dir/topics.log" >&2; die "creating topic $topic failed"; }
}

# acl add|remove ROLE RESOURCE-OPTIONS... -- OPERATIONS...: one AclCommand
# run (one JVM, a few seconds: the slow part of `up` and `provision`).
acl() {
  local action=$1 role=$2; shift 2
  local args=() ops=()
  while [ "$1" != -- ]; do args+=("$1"); shift; done
  shift
  for op in "$@"; do ops+=(--operation "$op"); done
  "${java_tool[@]}" org.apache.kafka.tools.AclCommand --bootstrap-server "$(bootstrap)" \
    --command-config "$dir/clients/admin.properties" "--$action" --force \
    --allow-principal "User:$(principal "$role")" --allow-host '*' \
    "${args[@]}" "${ops[@]}" >>"$dir/acls.log" 2>&1 ||
    { tail "$dir/acls.log" >&2; die "$action ACL for $role failed"; }
}

# The roles' ACLs (docs/operations.md, "Production settings", lists them).
# Read and Write imply Describe on the same resource.
grant() {
  # worker: consumes the commands in its group, produces dead letters.
  acl add worker --topic "$commands_topic" --group "$worker_group" -- Read
  acl add worker --topic "$dlq_topic" -- Write
  # relay: produces the result events from the outbox, nothing else.
  acl add relay --topic "$results_topic" -- Write
  # chargectl: publish and dlq replay write commands; dlq list/show read
  # dead letters (assigned partitions, no group offsets).
  acl add ctl --topic "$commands_topic" -- Write
  acl add ctl --topic "$dlq_topic" -- Read
  # console: reads dead letters, and the workers' group lag (committed
  # offsets, the commands topic's ends).
  acl add console --topic "$dlq_topic" -- Read
  acl add console --topic "$commands_topic" --group "$worker_group" -- Describe
  # order service: publishes commands, consumes results in its group.
  acl add orders --topic "$commands_topic" -- Write
  acl add orders --topic "$results_topic" --group "$orders_group" -- Read
}

provision() {
  local have
  kafka_jars
  have=$("${java_tool[@]}" org.apache.kafka.tools.TopicCommand --bootstrap-server "$(bootstrap)" \
    --command-config "$dir/clients/admin.properties" --list 2>>"$dir/topics.log") ||
    { tail "$dir/topics.log" >&2; die "listing topics failed"; }
  create_topic "$have" "$commands_topic" 12
  create_topic "$have" "$results_topic" 12
  create_topic "$have" "$dlq_topic" 3
  grant
}

up() {
  mkdir -p "$dir"
  kafka_jars
  secrets
  tls
  client_files
  local n
  for n in "${nodes[@]}"; do node_pid "$n" >/dev/null || node_config "$n"; done
  format_nodes
  start
  provision
  echo "kafka-prod: up, three nodes on $(bootstrap) (state and logs in $dir)"
  echo "  eval \"\$($0 env worker)\" exports a worker's Kafka settings"
}

down() {
  local n pid deadline
  for n in "${nodes[@]}"; do
    pid=$(node_pid "$n") && kill "$pid" 2>/dev/null || true
  done
  for n in "${nodes[@]}"; do
    if pid=$(node_pid "$n"); then
      deadline=$((SECONDS + 30))
      while kill -0 "$pid" 2>/dev/null && [ $SECONDS -lt $deadline ]; do sleep 0.2; done
      kill -9 "$pid" 2>/dev/null || true
      while kill -0 "$pid" 2>/dev/null; do sleep 0.1; done
    fi
    rm -f "$dir/node$n/kafka.pid"
  done
  echo "kafka-prod: down"
}

status() {
  local n rc=0 answers=""
  if [ -d "$dir/clients" ]; then
    kafka_jars
    answers=$(api_versions)
  fi
  for n in "${nodes[@]}"; do
    if node_pid "$n" >/dev/null &&
      grep -q "^127.0.0.1:$(client_port "$n") (id: $n .* -> (" <<<"$answers"; then
      echo "kafka node $n: up on 127.0.0.1:$(client_port "$n") (SASL_SSL)"
    else
      echo "kafka node $n: down"
      rc=1
    fi
  done
  return $rc
}

print_env() {
  local role=${1:-}
  [ -n "$role" ] || die "env: which role? (${roles[*]})"
  valid_role "$role"
  [ -s "$dir/secrets/$role.password" ] || die "no credentials in $dir: run '$0 up' first"
  cat <<EOF
export KAFKA_BOOTSTRAP_SERVERS='$(bootstrap)'
export KAFKA_SECURITY_PROTOCOL='SASL_SSL'
export KAFKA_SASL_MECHANISMS='SCRAM-SHA-512'
export KAFKA_SASL_USERNAME='$(principal "$role")'
export KAFKA_SASL_PASSWORD_FILE='$dir/secrets/$role.password'
export KAFKA_SSL_CA_LOCATION='$dir/tls/ca.crt'
export CHARGE_COMMANDS_TOPIC='$commands_topic'
export CHARGE_RESULTS_TOPIC='$results_topic'
export CHARGE_DLQ_TOPIC='$dlq_topic'
EOF
  [ "$role" != worker ] || echo "export KAFKA_GROUP_ID='$worker_group'"
}

# one_acl add|remove ROLE topic|group NAME OPERATION
one_acl() {
  local action=$1; shift
  [ $# -eq 4 ] || die "usage: $0 revoke|grant ROLE topic|group NAME OPERATION"
  valid_role "$1"
  case $2 in topic | group) ;; *) die "resource type '$2': topic or group" ;; esac
  kafka_jars
  acl "$action" "$1" "--$2" "$3" -- "$4"
  local did=granted
  [ "$action" = add ] || did=revoked
  echo "kafka-prod: $did $4 on $2 $3 for $(principal "$1")"
}

leader() {
  [ $# -eq 2 ] || die "usage: $0 leader TOPIC PARTITION"
  kafka_jars
  "${java_tool[@]}" org.apache.kafka.tools.TopicCommand --bootstrap-server "$(bootstrap)" \
    --command-config "$dir/clients/admin.properties" --describe --topic "$1" 2>/dev/null |
    awk -v p="$2" '$3 == "Partition:" && $4 == p { for (i = 5; i < NF; i++) if ($i == "Leader:") print $(i + 1) }' |
    grep -E '^[0-9]+$' || die "no leader found for $1 partition $2"
}

coordinator() {
  [ $# -eq 1 ] || die "usage: $0 coordinator GROUP"
  kafka_jars
  "${java_tool[@]}" org.apache.kafka.tools.consumer.group.ConsumerGroupCommand \
    --bootstrap-server "$(bootstrap)" --command-config "$dir/clients/admin.properties" \
    --describe --state --group "$1" 2>/dev/null |
    sed -n 's/.*127\.0\.0\.1:[0-9]* *(\([0-9]*\)).*/\1/p' | head -n 1 | grep -E '^[0-9]+$' ||
    die "no coordinator found for group $1"
}

kill_node() {
  local pid
  [[ "${1:-}" =~ ^[123]$ ]] || die "usage: $0 kill 1|2|3"
  if pid=$(node_pid "$1"); then
    kill -9 "$pid"
    while kill -0 "$pid" 2>/dev/null && [ "$(awk '{print $3}' "/proc/$pid/stat" 2>/dev/null)" != Z ]; do
      sleep 0.1
    done
    echo "kafka-prod: node $1 killed (pid $pid)"
  else
    echo "kafka-prod: node $1 was not running"
  fi
  rm -f "$dir/node$1/kafka.pid"
}

case "${1:-}" in
  up) up ;;
  down) down ;;
  status) status ;;
  env) print_env "${2:-}" ;;
  provision) provision ;;
  revoke) shift; one_acl remove "$@" ;;
  grant) shift; one_acl add "$@" ;;
  leader) shift; leader "$@" ;;
  coordinator) shift; coordinator "$@" ;;
  kill) kill_node "${2:-}" ;;
  start) start; echo "kafka-prod: up on $(bootstrap)" ;;
  *) echo "usage: $0 up|down|status|env ROLE|provision|revoke|grant ROLE TYPE NAME OP|leader TOPIC P|coordinator GROUP|kill N|start" >&2; exit 2 ;;
esac
