#!/usr/bin/env bash
# The demo: charged's main job on the local stack. Starts PostgreSQL and
# Kafka, migrates, runs psp-sim with faults (lost answers, 5xx before and
# after executing, latency) that also sends signed webhooks, two workers, a
# reconciler and the api (which applies those webhooks), publishes a burst
# of charge commands with duplicates and a few bad ones (a relay publishes
# the result events), waits until
# everything is settled and committed (the reconciler settles the unknown
# outcomes on the provider's evidence), refunds some of the charges (in
# full, in part, twice, past their charge, of declined ones), and reports
# what the provider actually charged and refunded; then the auditor proves
# from psp-sim's own books that nothing was charged twice. A shop that ships
# later authorizes, captures (some in part) and voids (DEMO_AUTHORIZATIONS).
#
#   DEMO_COMMANDS=1000 DEMO_AUTHORIZATIONS=200 tools/demo.sh
set -euo pipefail
repo=$(cd "$(dirname "$0")/.." && pwd)
cd "$repo"
n=${DEMO_COMMANDS:-1000}
holds=${DEMO_AUTHORIZATIONS:-200}

deploy/install-deps.sh
cmake -S . -B build -DCHARGED_FAILPOINTS=OFF >/dev/null
cmake --build build -j2 >/dev/null
deploy/stack.sh up
demo_start=$(date +%s)
eval "$(deploy/stack.sh env)"
build/worker/chargectl/chargectl migrate

run=.stack/demo
mkdir -p "$run"
export PROVIDER_API_KEY=sk_test_demo
export PROVIDER_BASE_URL=http://127.0.0.1:12111
export PROVIDER_TIMEOUT_MS=2000 WORKER_LEASE_MS=15000 WORKER_RETRY_MAX_MS=1000
# One retry of an unknown outcome, so that the reconciler has work to show.
export WORKER_UNKNOWN_RETRIES=1
# psp-sim fails 20% of calls on purpose: the breaker (it opens when half
# the calls of its window fail) keeps to its defaults through it.
export KAFKA_SESSION_TIMEOUT_MS=6000 KAFKA_HEARTBEAT_INTERVAL_MS=1000
# A fast reconciler, for a demo: first look after 2 s, then every second.
export RECONCILER_FIRST_LOOK_MS=2000 RECONCILER_SCHEDULE_MS=1000 RECONCILER_POLL_MS=200
# psp-sim signs its webhooks with the secret the api checks them with.
export WEBHOOK_SIGNING_SECRET=whsec_demo_only_secret PSP_SIM_WEBHOOK_SECRET=whsec_demo_only_secret
export API_ADDR=127.0.0.1:8080

pids=()
cleanup() {
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
  wait 2>/dev/null || true
}
trap cleanup EXIT

build/tools/psp-sim/psp-sim --api-key "$PROVIDER_API_KEY" --seed "$RANDOM" \
  --latency-ms 5 --latency-jitter-ms 15 --fault drop_after=0.10 \
  --fault error_after=0.05 --fault error_before=0.05 \
  --webhook-url "http://$API_ADDR/v1/webhooks/provider" 2>"$run/psp-sim.log" &
pids+=($!)
# Five daemons on one host: each admin listener (/healthz, /readyz,
# /metrics) takes a free port, named in its log's "admin listener started".
export ADMIN_ADDR=127.0.0.1:0
for i in 1 2; do
  WORKER_ID="demo-worker-$i" build/worker/charged worker 2>"$run/worker-$i.log" &
  pids+=($!)
done
WORKER_ID=demo-reconciler build/worker/charged reconciler 2>"$run/reconciler.log" &
pids+=($!)
WORKER_ID=demo-relay build/worker/charged relay 2>"$run/relay.log" &
pids+=($!)
build/worker/charged api 2>"$run/api.log" &
pids+=($!)

# The example order service, with a database of its own (new each run), run
# by the python of deploy/.tools (confluent-kafka, psycopg; install-deps.sh
# put them there): it places 100 orders through its outbox, tries a declined
# one once more with another card, refunds every fifth paid one, and takes
# each result event once as a reason to ask the api, whose answer pays.
orders=examples/order_service/order_service.py
py=deploy/.tools/bin/python
export ORDERS_DATABASE_URL="${DATABASE_URL%/*}/orders" ORDERS_GROUP_ID=demo-orders-$demo_start
psql -X -q "$DATABASE_URL" -c 'DROP DATABASE IF EXISTS orders' -c 'CREATE DATABASE orders'
"$py" "$orders" init
CHARGED_API_URL="http://$API_ADDR" "$py" "$orders" run 2>"$run/order-service.log" &
pids+=($!)
"$py" "$orders" place-orders --count 100 >"$run/order-service-orders.log" 2>&1
# And as a shop that ships later: 30 orders authorized now, shipped (some
# with an item missing) and canceled by the report once they are held.
"$py" "$orders" place-orders --count 30 --authorize >>"$run/order-service-orders.log" 2>&1

# The report, one aligned line each: the burst, the refunds, the order
# service, what the provider's webhooks did, the status query a client that
# lost its answer would make instead of charging again, and the audit of
# every intent and refund psp-sim made since the demo began against the
# ledger (docs/auditor.md). A double charge, a refund past its charge or an
# audit finding fails the demo.
python3 tools/demo_report.py --commands "$n" --authorizations "$holds" --psp-admin http://127.0.0.1:12112 \
  --chargectl build/worker/chargectl/chargectl --state "$run" --orders-db "$ORDERS_DATABASE_URL" \
  --api "$API_ADDR" --demo-start "$demo_start" --orders-service "$py $orders"
echo "demo: logs in $run; the stack stays up (deploy/stack.sh down stops it)"
