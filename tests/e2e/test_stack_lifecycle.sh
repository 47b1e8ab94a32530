#!/usr/bin/env bash
# deploy/stack.sh on its own ports and directory: `up` starts PostgreSQL and
# Kafka, kcat lists the contract's three topics, psql reaches the database,
# a second `up` changes nothing, and `down` leaves no process of the stack.
set -euo pipefail
repo=${CHARGED_SOURCE_DIR:?set by tools/run-all-tests.sh or ctest}
dir=$(mktemp -d /tmp/charged-stack-test.XXXXXX)
export CHARGED_STACK_DIR=$dir
export CHARGED_PG_PORT=${CHARGED_LIFECYCLE_PG_PORT:-55499}
export CHARGED_KAFKA_PORT=${CHARGED_LIFECYCLE_KAFKA_PORT:-19192}
export CHARGED_KAFKA_CONTROLLER_PORT=${CHARGED_LIFECYCLE_CONTROLLER_PORT:-19193}
stack=$repo/deploy/stack.sh

fail() { echo "FAIL: $*" >&2; exit 1; }
cleanup() { "$stack" down >/dev/null 2>&1 || true; rm -rf "$dir"; }
trap cleanup EXIT

stack_processes() {
  # Every process whose command line names this stack's directory.
  { pgrep -f -- "$dir" || true; } | wc -l
}

"$stack" up >/dev/null
topics=$(kcat -L -b "127.0.0.1:$CHARGED_KAFKA_PORT" -m 10 | sed -n 's/^  topic "\([^"]*\)" with \([0-9]*\) partitions.*/\1 \2/p' | sort)
echo "$topics"
grep -qx 'payments.charge.commands 12' <<<"$topics" || fail "commands topic with 12 partitions missing"
grep -qx 'payments.charge.results [0-9]*' <<<"$topics" || fail "results topic missing"
grep -qx 'payments.charge.commands.dlq [0-9]*' <<<"$topics" || fail "dlq topic missing"

out=$(psql -X -tA "postgresql://charged@127.0.0.1:$CHARGED_PG_PORT/charged" -c 'SELECT current_database(), current_user')
[ "$out" = "charged|charged" ] || fail "psql answered '$out'"

kafka_pid=$(cat "$dir/kafka.pid")
"$stack" up >/dev/null
[ "$(cat "$dir/kafka.pid")" = "$kafka_pid" ] || fail "second up restarted Kafka"
"$stack" status

[ "$(stack_processes)" -gt 0 ] || fail "no process of the stack found while up"
"$stack" down
n=$(stack_processes)
[ "$n" -eq 0 ] || { pgrep -a -f -- "$dir" >&2; fail "$n processes left after down"; }
if "$stack" status >/dev/null; then fail "status says up after down"; fi
echo "stack lifecycle: ok"
