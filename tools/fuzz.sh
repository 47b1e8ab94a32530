#!/usr/bin/env bash
# Builds and runs the libFuzzer targets of tests/fuzz (docs/testing.md#fuzzing).
set -euo pipefail

usage() {
    cat <<'USAGE'
Usage: tools/fuzz.sh [options] [target...]

Configures and builds build-fuzz/ with clang-14 (-DCHARGED_FUZZ=ON: the
libraries with -fsanitize=fuzzer-no-link,address,undefined, the targets with
-fsanitize=fuzzer,address,undefined), replays tests/fuzz/regressions/<target>/,
then fuzzes each target (all, or those named) from tests/fuzz/corpus/<target>/.

New inputs go to a scratch directory, never into the committed corpus
(unless --merge). A crash, leak, timeout or broken property stops that
target, keeps the input in the scratch directory and makes the exit status 1.
Per target it prints executions, exec/s and the result.

Options:
  --runs N        executions per target (default 20000)
  --seconds S     fuzz each target for S seconds instead of --runs
  --jobs J        targets at a time, 1 or 2 (default 1; the machine has 2 cores)
  --scratch DIR   where new inputs and crashes go
                  (default <build tree>/fuzz-runs/<UTC time>/)
  --merge         afterwards, merge the inputs that add coverage into
                  tests/fuzz/corpus/<target>/ (libFuzzer -merge=1)
  --build-dir DIR the clang build tree (default build-fuzz/ of the source)
  --no-build      use the build tree as it is
  --list          print the targets and exit
  -h, --help      this text

Targets: command card_data provider_answer config webhook_signature
webhook_event traceparent breaker console_input.
Reproduce one input:  build-fuzz/tests/fuzz/fuzz_<target> <file>
Long pass (docs/testing.md#fuzzing):  tools/fuzz.sh --runs 10000000 --jobs 2
USAGE
}

ROOT=$(cd "$(dirname "$0")/.." && pwd)
BUILD=$ROOT/build-fuzz
TARGETS=(command card_data provider_answer config webhook_signature webhook_event
         traceparent breaker console_input)
RUNS=20000
SECONDS_EACH=
JOBS=1
SCRATCH=
MERGE=0
BUILD_IT=1
CHOSEN=()

while [ $# -gt 0 ]; do
    case "$1" in
    --runs) RUNS=$2; shift 2 ;;
    --seconds) SECONDS_EACH=$2; shift 2 ;;
    --jobs) JOBS=$2; shift 2 ;;
    --scratch) SCRATCH=$2; shift 2 ;;
    --build-dir) BUILD=$2; shift 2 ;;
    --merge) MERGE=1; shift ;;
    --no-build) BUILD_IT=0; shift ;;
    --list) printf '%s\n' "${TARGETS[@]}"; exit 0 ;;
    -h | --help) usage; exit 0 ;;
    -*) echo "fuzz.sh: unknown option $1 (--help)" >&2; exit 2 ;;
    *) CHOSEN+=("$1"); shift ;;
    esac
done
[ ${#CHOSEN[@]} -gt 0 ] || CHOSEN=("${TARGETS[@]}")
for t in "${CHOSEN[@]}"; do
    case " ${TARGETS[*]} " in
    *" $t "*) ;;
    *) echo "fuzz.sh: no target '$t' (--list)" >&2; exit 2 ;;
    esac
done
case "$JOBS" in 1 | 2) ;; *) echo "fuzz.sh: --jobs is 1 or 2" >&2; exit 2 ;; esac

# Input bounds: a little past the largest input each parser meets in real
# use, so that the time goes into shapes, not into length.
max_len() {
    case "$1" in
    traceparent) echo 128 ;;
    card_data) echo 512 ;;
    config | webhook_signature) echo 2048 ;;
    *) echo 8192 ;;
    esac
}

if [ "$BUILD_IT" = 1 ]; then
    command -v clang-14 >/dev/null || { echo "fuzz.sh: clang-14 not found" >&2; exit 2; }
    mkdir -p "$BUILD"
    CC=clang-14 cmake -S "$ROOT" -B "$BUILD" -DCHARGED_FUZZ=ON \
        -DCMAKE_BUILD_TYPE=RelWithDebInfo >"$BUILD/configure.log" 2>&1 ||
        { cat "$BUILD/configure.log" >&2; exit 2; }
    nice -n 10 cmake --build "$BUILD" -j2 --target charged_fuzz_all >"$BUILD/build.log" 2>&1 ||
        { tail -40 "$BUILD/build.log" >&2; exit 2; }
fi
[ -n "$SCRATCH" ] || SCRATCH=$BUILD/fuzz-runs/$(date -u +%Y%m%dT%H%M%SZ)
mkdir -p "$SCRATCH"

export ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=1:allocator_may_return_null=1}
export UBSAN_OPTIONS=${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}

# One target: regressions replayed, then fuzzed; its summary line in
# $SCRATCH/<target>/result.
run_target() {
    local t=$1 bin=$BUILD/tests/fuzz/fuzz_$1 dir=$SCRATCH/$1
    local log=$dir/fuzz.log result=ok
    mkdir -p "$dir/corpus" "$dir/crashes"
    local common=(-max_len="$(max_len "$t")" -timeout=10 -rss_limit_mb=2048
                  -artifact_prefix="$dir/crashes/")
    local reg=$ROOT/tests/fuzz/regressions/$t
    if [ -d "$reg" ] && [ -n "$(ls -A "$reg")" ]; then
        if ! "$bin" "${common[@]}" "$reg"/* >"$dir/regressions.log" 2>&1; then
            printf '%-18s %12s %10s  %s\n' "$t" - - \
                "REGRESSION FAILED: $dir/regressions.log" >"$dir/result"
            return
        fi
    fi
    local budget=(-runs="$RUNS")
    [ -z "$SECONDS_EACH" ] || budget=(-max_total_time="$SECONDS_EACH")
    # The scratch corpus first: libFuzzer writes new inputs only there.
    local start end
    start=$(date +%s.%N)
    if ! nice -n 10 "$bin" "${common[@]}" "${budget[@]}" -print_final_stats=1 \
        "$dir/corpus" "$ROOT/tests/fuzz/corpus/$t" >"$log" 2>&1; then
        result="FAILED: $(ls "$dir/crashes" | head -1 | sed "s|^|$dir/crashes/|") (log $log)"
    fi
    end=$(date +%s.%N)
    local execs rate
    execs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log" | tail -1)
    # libFuzzer's own rate is in whole seconds of run time: 0 for a short run.
    rate=$(awk -v n="${execs:-0}" -v a="$start" -v b="$end" \
        'BEGIN { d = b - a; printf "%d", (d > 0 ? n / d : 0) }')
    if [ "$result" = ok ] && [ "$MERGE" = 1 ]; then
        "$bin" -merge=1 -max_len="$(max_len "$t")" "$ROOT/tests/fuzz/corpus/$t" \
            "$dir/corpus" >"$dir/merge.log" 2>&1 || result="MERGE FAILED: $dir/merge.log"
    fi
    printf '%-18s %12s %10s  %s\n' "$t" "${execs:--}" "${rate:--}" "$result" >"$dir/result"
}

running=0
for t in "${CHOSEN[@]}"; do
    if [ "$running" -ge "$JOBS" ]; then
        wait -n || true # whichever ends first frees its core
        running=$((running - 1))
    fi
    run_target "$t" &
    running=$((running + 1))
done
wait

printf '%-18s %12s %10s  %s\n' target executions exec/s result
rc=0
for t in "${CHOSEN[@]}"; do
    cat "$SCRATCH/$t/result"
    grep -q '  ok$' "$SCRATCH/$t/result" || rc=1
done
echo "scratch: $SCRATCH"
exit $rc
