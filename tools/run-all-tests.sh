#!/usr/bin/env bash
# Runs every test of charged on this machine, from nothing: installs what is
# missing, builds twice (plain, and ASan+UBSan; warnings are errors), starts
# three private test stacks (PostgreSQL + Kafka on their own ports), runs
# every test of both builds, and stops the stacks whatever happened. Exits
# non-zero when any test fails. docs/testing.md says what runs beside what
# and why that is safe, with the stage times on this 2-core machine.
#
#   tools/run-all-tests.sh             every test (what CI runs, via .ci/run)
#   tools/run-all-tests.sh --changed [REF]
#                                      a developer's inner loop, not what CI
#                                      runs: the plain build, the unit tests
#                                      when C changed, and the tests whose
#                                      own files changed since REF (HEAD)
#
# CHARGED_TEST_JOBS (3): scenarios at a time on the plain build's stack;
# CHARGED_TEST_ASAN_JOBS (2): the same for the sanitizer build's stack.
set -euo pipefail

repo=$(cd "$(dirname "$0")/.." && pwd)
cd "$repo"
jobs=${CHARGED_BUILD_JOBS:-2}
plain_jobs=${CHARGED_TEST_JOBS:-3}
asan_jobs=${CHARGED_TEST_ASAN_JOBS:-2}
changed_ref=
case "${1:-}" in
  --changed) changed_ref=${2:-HEAD} ;;
  "") ;;
  -h | --help) sed -n '2,17p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
  *) echo "run-all-tests: unknown argument '$1' (try --help)" >&2; exit 2 ;;
esac

t_start=$SECONDS
stage_times=()
stage_done() { # name start-seconds
  stage_times+=("$(printf '%-44s %5ds' "$1" $((SECONDS - $2)))")
}

deploy/install-deps.sh

t=$SECONDS
cmake -S . -B build -DCHARGED_WERROR=ON -DCHARGED_FAILPOINTS=ON >/dev/null
cmake --build build -j"$jobs"
if [ -z "$changed_ref" ]; then
  cmake -S . -B build-asan -DCHARGED_SANITIZE=ON -DCHARGED_WERROR=ON -DCHARGED_FAILPOINTS=ON \
    -DCMAKE_BUILD_TYPE=Debug >/dev/null
  cmake --build build-asan -j"$jobs"
fi
stage_done "installs and builds" "$((t_start))"

# Three stacks apart from the demo's: the plain build's tests share one and
# the sanitizer build's another, several at a time (each scenario has its
# own database, topics and group); the tests that stop, freeze or kill a
# server (label `exclusive`) run one at a time on the third, so that they
# take nothing away from a test beside them.
stack_env() { # dir pg-port kafka-port controller-port
  export CHARGED_STACK_DIR=$repo/$1
  export CHARGED_PG_PORT=$2 CHARGED_KAFKA_PORT=$3 CHARGED_KAFKA_CONTROLLER_PORT=$4
  export CHARGED_TEST_DATABASE_URL="postgresql://charged@127.0.0.1:$2/charged"
  export CHARGED_TEST_KAFKA="127.0.0.1:$3"
  # A broker restart on a loaded machine takes longer than at a desk.
  export CHARGED_STACK_TIMEOUT=${CHARGED_STACK_TIMEOUT:-240}
}
plain_stack=(build/test-stack "${CHARGED_TEST_PG_PORT:-55433}" "${CHARGED_TEST_KAFKA_PORT:-19092}"
  "${CHARGED_TEST_KAFKA_CONTROLLER_PORT:-19093}")
asan_stack=(build-asan/test-stack "${CHARGED_TEST_ASAN_PG_PORT:-55434}"
  "${CHARGED_TEST_ASAN_KAFKA_PORT:-19094}" "${CHARGED_TEST_ASAN_KAFKA_CONTROLLER_PORT:-19095}")
# (test_kafka_compat starts a broker of its own on the plain stack's Kafka
# port + 5 and + 6: 19097 and 19098 by default.)
excl_stack=(build/test-stack-exclusive "${CHARGED_TEST_EXCL_PG_PORT:-55435}"
  "${CHARGED_TEST_EXCL_KAFKA_PORT:-19102}" "${CHARGED_TEST_EXCL_KAFKA_CONTROLLER_PORT:-19103}")
stacks=(plain_stack)
[ -n "$changed_ref" ] || stacks+=(asan_stack excl_stack)
# The production profile's Kafka (issue 39: three SASL_SSL nodes, per-role
# ACLs), started by the fourth set for the short form of its scenarios.
prod_kafka=(build/test-stack-production "${CHARGED_TEST_PROD_KAFKA_PORT:-19611}")
prod_kafka_sh() { # command...
  CHARGED_STACK_DIR=$repo/${prod_kafka[0]} CHARGED_PROD_KAFKA_PORT=${prod_kafka[1]} \
    deploy/production/kafka.sh "$@"
}
stacks_down() {
  local s
  for s in "${stacks[@]}"; do
    eval "(stack_env \"\${${s}[@]}\" && deploy/stack.sh down) || true"
  done
  [ -n "$changed_ref" ] || prod_kafka_sh down >/dev/null 2>&1 || true
}
trap stacks_down EXIT
t=$SECONDS
pids=()
for s in "${stacks[@]}"; do
  eval "(stack_env \"\${${s}[@]}\" && deploy/stack.sh up) &"
  pids+=($!)
done
for p in "${pids[@]}"; do wait "$p"; done
stage_done "stacks up" "$t"
export CHARGED_SOURCE_DIR=$repo
export CTEST_OUTPUT_ON_FAILURE=1

if [ -n "$changed_ref" ]; then
  # The tests named after a changed file, plus the unit tests if C changed.
  names=$({ git diff --name-only "$changed_ref"; git ls-files --others --exclude-standard; } |
    sed -n 's#^tests/.*/\(test_[A-Za-z0-9_]*\)\.[a-z]*$#\1#p' | sort -u | paste -sd'|')
  args=()
  if { git diff --name-only "$changed_ref"; git ls-files --others --exclude-standard; } |
    grep -qE '\.(c|h)$'; then
    args+=(-L unit)
  fi
  [ -z "$names" ] || args+=(-R "^(${names})(_.*)?\$")
  if [ ${#args[@]} -eq 0 ]; then
    echo "run-all-tests --changed: nothing changed since $changed_ref that a test names"
    exit 0
  fi
  if [ ${#args[@]} -gt 2 ]; then
    # -L and -R together select their intersection: run them one after the other.
    (stack_env "${plain_stack[@]}" && cd build && ctest -j"$plain_jobs" -LE exclusive -L unit &&
      ctest -j"$plain_jobs" -R "^(${names})(_.*)?\$")
  else
    (stack_env "${plain_stack[@]}" && cd build && ctest -j"$plain_jobs" "${args[@]}")
  fi
  exit $?
fi

# Four sets at once, each on its stack, each with its own log (printed whole
# at the end, so that they do not interleave line by line):
#  - plain: every test of build/ but the exclusive and quiet ones,
#    $plain_jobs at a time;
#  - exclusive: the exclusive tests of build/, then those of build-asan/,
#    one at a time, on the third stack;
#  - asan: every test of build-asan/ but the exclusive and quiet ones,
#    $asan_jobs at a time;
#  - alone: the scenarios that judge rates over seconds (label `alone`),
#    one at a time on the plain stack; the fuzz targets' short pass
#    (label `fuzz`: its own build and libFuzzer, a core for ~3 minutes)
#    and the Kafka 3.9 scenarios on a broker of their own (label
#    `compat`, ~3 minutes), both kept off the plain set's queue, the
#    command's critical path; then the production profile's
#    Kafka started and the short form of its scenarios (label
#    `production_short`; the long ones, `production`, are docs/testing.md's
#    long suite).
# Several scenarios at once stretch every deadline they wait on (a deadline
# bounds a wait, it never decides what passes): CHARGED_TEST_TIMEOUT_SCALE
# for the harness (tests/e2e/charged_e2e.py), CK_TIMEOUT_MULTIPLIER for Check.
plain_env() {
  export CHARGED_TEST_TIMEOUT_SCALE=3 CK_TIMEOUT_MULTIPLIER=3
}
asan_env() {
  export ASAN_OPTIONS=detect_leaks=1:abort_on_error=1
  export UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1
  # Sanitized binaries run 2-5x slower, beside everything else.
  export CHARGED_TEST_TIMEOUT_SCALE=5 CK_TIMEOUT_MULTIPLIER=5
}
plain_set() {
  stack_env "${plain_stack[@]}"
  plain_env
  cd build && ctest --timeout 900 -j"$plain_jobs" -LE 'exclusive|quiet|production|alone|fuzz|compat'
}
exclusive_set() {
  local rc=0
  stack_env "${excl_stack[@]}"
  (plain_env && cd build && ctest --timeout 1200 -L exclusive -LE quiet) || rc=1
  (asan_env && cd build-asan && ctest --timeout 1800 -L exclusive -LE quiet) || rc=1
  return $rc
}
asan_set() {
  stack_env "${asan_stack[@]}"
  asan_env
  cd build-asan && ctest --timeout 1800 -j"$asan_jobs" -LE 'exclusive|quiet|production|alone'
}
alone_set() {
  local rc=0
  stack_env "${plain_stack[@]}"
  plain_env
  (cd build && ctest --timeout 900 -L alone) || rc=1
  (cd build && ctest --timeout 900 -L '^fuzz$') || rc=1
  (cd build && ctest --timeout 900 -L '^compat$') || rc=1
  if prod_kafka_sh up; then
    export CHARGED_PROD_STACK_DIR=$repo/${prod_kafka[0]}
    export CHARGED_PROD_KAFKA_PORT=${prod_kafka[1]}
    (cd build && ctest --timeout 900 -L '^production_short$') || rc=1
  else
    rc=1
  fi
  prod_kafka_sh down || rc=1
  return $rc
}
# Then, alone on an idle machine, the tests that bound a wait by the clock
# (label `quiet`): the load of the others would decide them otherwise.
quiet_set() {
  local rc=0
  stack_env "${plain_stack[@]}"
  (cd build && ctest --timeout 900 -L quiet) || rc=1
  stack_env "${asan_stack[@]}"
  (asan_env && export CHARGED_TEST_TIMEOUT_SCALE=2 CK_TIMEOUT_MULTIPLIER=2 &&
    cd build-asan && ctest --timeout 900 -L quiet) || rc=1
  return $rc
}

logs=$(mktemp -d)
status=0
echo "== tests: plain build ($plain_jobs at a time), its exclusive tests, the" \
  "sanitizer build ($asan_jobs at a time) and the rate-judging ones (1 at a time) then the" \
  "production profile's short scenario, side by side"
t=$SECONDS
for set in plain exclusive asan alone; do
  ( t0=$SECONDS; rc=0; "${set}_set" || rc=$?; echo "$set: $((SECONDS - t0))s" >"$logs/$set.time"
    exit $rc ) >"$logs/$set.log" 2>&1 &
  eval "${set}_pid=$!"
done
# shellcheck disable=SC2154
for set in plain exclusive asan alone; do
  eval "wait \$${set}_pid" || status=1
  echo "== $set"
  cat "$logs/$set.log"
  stage_times+=("$(printf '%-44s %5ss' "  $set set" "$(cut -d' ' -f2 "$logs/$set.time" | tr -d s)")")
done
stage_done "the four sets side by side" "$t"
t=$SECONDS
echo "== tests that bound a wait by the clock, alone"
quiet_set || status=1
stage_done "the quiet tests, alone" "$t"
rm -rf "$logs"

echo "== stage times"
printf '%s\n' "${stage_times[@]}"
printf '%-44s %5ds\n' "total" $((SECONDS - t_start))
exit $status
