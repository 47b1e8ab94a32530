#!/usr/bin/env bash
# Runs every test of charged on this machine, from nothing: installs what is
# missing, builds (warnings are errors), starts a private test stack
# (PostgreSQL + Kafka on their own ports), runs all tests, then builds with
# ASan+UBSan and runs the tests again, and stops the stack whatever happened.
# Exits non-zero when any test fails.
set -euo pipefail

repo=$(cd "$(dirname "$0")/.." && pwd)
cd "$repo"
jobs=${CHARGED_BUILD_JOBS:-2}

deploy/install-deps.sh

cmake -S . -B build -DCHARGED_WERROR=ON -DCHARGED_FAILPOINTS=ON >/dev/null
cmake --build build -j"$jobs"
cmake -S . -B build-asan -DCHARGED_SANITIZE=ON -DCHARGED_WERROR=ON -DCHARGED_FAILPOINTS=ON \
  -DCMAKE_BUILD_TYPE=Debug >/dev/null
cmake --build build-asan -j"$jobs"

# The test stacks live apart from the demo's, so all can be up at once: one
# for the plain build's tests, one for the sanitizer build's, so that the two
# sets of scenarios (which share their stack and wait on its timers) run side
# by side instead of one after the other.
stack_env() { # build-dir pg-port kafka-port controller-port
  export CHARGED_STACK_DIR=$repo/$1/test-stack
  export CHARGED_PG_PORT=$2 CHARGED_KAFKA_PORT=$3 CHARGED_KAFKA_CONTROLLER_PORT=$4
  export CHARGED_TEST_DATABASE_URL="postgresql://charged@127.0.0.1:$2/charged"
  export CHARGED_TEST_KAFKA="127.0.0.1:$3"
}
plain_stack=(build "${CHARGED_TEST_PG_PORT:-55433}" "${CHARGED_TEST_KAFKA_PORT:-19092}"
  "${CHARGED_TEST_KAFKA_CONTROLLER_PORT:-19093}")
asan_stack=(build-asan "${CHARGED_TEST_ASAN_PG_PORT:-55434}" "${CHARGED_TEST_ASAN_KAFKA_PORT:-19094}"
  "${CHARGED_TEST_ASAN_KAFKA_CONTROLLER_PORT:-19095}")
stacks_down() {
  (stack_env "${plain_stack[@]}" && deploy/stack.sh down) || true
  (stack_env "${asan_stack[@]}" && deploy/stack.sh down) || true
}
trap stacks_down EXIT
(stack_env "${plain_stack[@]}" && deploy/stack.sh up)
(stack_env "${asan_stack[@]}" && deploy/stack.sh up)
export CHARGED_SOURCE_DIR=$repo

# Tests that race nothing (unit, valgrind, build, format, cli, deploy, fuzz:
# of these only the image test uses the stack) run $jobs at a time, first and
# alone; the rest, which share their stack and wait on its timers, one at a
# time per build, the two builds at once.
alone='^(unit|valgrind|build|format|cli|deploy|fuzz)$'
echo "== tests that race nothing (build/)"
status=0
(stack_env "${plain_stack[@]}" && cd build &&
  ctest --output-on-failure --timeout 900 -j"$jobs" -L "$alone") || status=1

plain_scenarios() {
  stack_env "${plain_stack[@]}"
  # The sanitizer build's tests run beside these: every deadline is
  # stretched (a deadline bounds a wait, it never decides what passes).
  export CHARGED_TEST_TIMEOUT_SCALE=2 CK_TIMEOUT_MULTIPLIER=2
  cd build && ctest --output-on-failure --timeout 900 -LE "$alone"
}
asan_tests() {
  stack_env "${asan_stack[@]}"
  export ASAN_OPTIONS=detect_leaks=1:abort_on_error=1
  export UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1
  # Sanitized binaries run 2-5x slower, beside the plain build's scenarios:
  # every deadline the tests wait for is stretched (tests/e2e/charged_e2e.py;
  # Check reads CK_TIMEOUT_MULTIPLIER).
  export CHARGED_TEST_TIMEOUT_SCALE=4 CK_TIMEOUT_MULTIPLIER=4
  cd build-asan
  local rc=0
  ctest --output-on-failure --timeout 900 -L "$alone" || rc=1
  ctest --output-on-failure --timeout 1800 -LE "$alone" || rc=1
  return $rc
}
# Each set's output goes to its own log, printed whole when both are done,
# so that the two do not interleave line by line.
logs=$(mktemp -d)
echo "== scenarios (build/) beside all tests under ASan+UBSan (build-asan/)"
(plain_scenarios) > "$logs/plain.log" 2>&1 &
plain_pid=$!
(asan_tests) > "$logs/asan.log" 2>&1 &
asan_pid=$!
wait "$plain_pid" || status=1
wait "$asan_pid" || status=1
echo "== scenarios (build/)"
cat "$logs/plain.log"
echo "== tests under ASan+UBSan (build-asan/)"
cat "$logs/asan.log"
rm -rf "$logs"
exit $status
