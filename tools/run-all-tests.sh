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

# The test stack lives apart from the demo's, so both can be up at once.
export CHARGED_STACK_DIR=${CHARGED_TEST_STACK_DIR:-$repo/build/test-stack}
export CHARGED_PG_PORT=${CHARGED_TEST_PG_PORT:-55433}
export CHARGED_KAFKA_PORT=${CHARGED_TEST_KAFKA_PORT:-19092}
export CHARGED_KAFKA_CONTROLLER_PORT=${CHARGED_TEST_KAFKA_CONTROLLER_PORT:-19093}
trap 'deploy/stack.sh down' EXIT
deploy/stack.sh up

export CHARGED_TEST_DATABASE_URL="postgresql://charged@127.0.0.1:$CHARGED_PG_PORT/charged"
export CHARGED_TEST_KAFKA="127.0.0.1:$CHARGED_KAFKA_PORT"
export CHARGED_SOURCE_DIR=$repo

# Tests that race nothing (unit, valgrind, build, format, cli, deploy: of
# these only the image test uses the stack) run $jobs at a time; the rest,
# which share the stack and wait on its timers, one at a time.
alone='^(unit|valgrind|build|format|cli|deploy)$'
status=0
echo "== tests (build/)"
(cd build && ctest --output-on-failure --timeout 900 -j"$jobs" -L "$alone") || status=1
(cd build && ctest --output-on-failure --timeout 900 -LE "$alone") || status=1
echo "== tests under ASan+UBSan (build-asan/)"
export ASAN_OPTIONS=detect_leaks=1:abort_on_error=1
export UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1
# Sanitized binaries run 2-5x slower: every deadline the tests wait for is
# stretched (tests/e2e/charged_e2e.py; Check reads CK_TIMEOUT_MULTIPLIER).
export CHARGED_TEST_TIMEOUT_SCALE=3
export CK_TIMEOUT_MULTIPLIER=3
(cd build-asan && ctest --output-on-failure --timeout 900 -j"$jobs" -L "$alone") || status=1
(cd build-asan && ctest --output-on-failure --timeout 900 -LE "$alone") || status=1
exit $status
