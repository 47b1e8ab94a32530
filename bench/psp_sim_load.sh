#!/usr/bin/env bash
# psp-sim under load from wrk on loopback: requests per second with N
# concurrent connections, for new charges (each a new key, booked in the
# ledger) against a baseline of look-ups of one intent (no writes), in the
# same invocation. Usage: bench/psp_sim_load.sh [connections] [seconds]
set -euo pipefail
repo=$(cd "$(dirname "$0")/.." && pwd)
conns=${1:-1000}
secs=${2:-10}
sim=$repo/build/tools/psp-sim/psp-sim
command -v wrk >/dev/null || { echo "needs wrk (apt-get install wrk)" >&2; exit 2; }
[ -x "$sim" ] || { echo "build first: cmake --build build" >&2; exit 2; }
ulimit -n 65536 2>/dev/null || true

port=12211 admin=12212
"$sim" --port $port --admin-port $admin --api-key sk_test_bench 2>/dev/null &
pid=$!
trap 'kill $pid 2>/dev/null; wait $pid 2>/dev/null' EXIT
for _ in $(seq 100); do curl -sf "http://127.0.0.1:$admin/health" >/dev/null && break; sleep 0.1; done

id=$(curl -s -H 'Authorization: Bearer sk_test_bench' -d 'amount=1&currency=eur&payment_method=pm_card_visa&confirm=true' \
  "http://127.0.0.1:$port/v1/payment_intents" | sed 's/.*"id":"\([^"]*\)".*/\1/')

rps() { sed -n 's/^Requests\/sec: *\([0-9.]*\).*/\1/p'; }
base=$(wrk -t2 -c"$conns" -d"${secs}s" -H 'Authorization: Bearer sk_test_bench' \
  "http://127.0.0.1:$port/v1/payment_intents/$id" | tee /dev/stderr | rps)
charge=$(wrk -t2 -c"$conns" -d"${secs}s" -s "$repo/bench/psp_sim_charge.lua" \
  "http://127.0.0.1:$port" | tee /dev/stderr | rps)
charges=$(curl -s "http://127.0.0.1:$admin/ledger" | python3 -c 'import json,sys; print(len(json.load(sys.stdin)["charges"]))')
echo "connections=$conns seconds=$secs"
echo "look-up baseline: $base req/s"
echo "new charges:      $charge req/s (ledger holds $charges charges)"
python3 -c "print('ratio charges/look-ups: %.2f' % ($charge / $base))"
