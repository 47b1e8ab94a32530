#!/usr/bin/env bash
# The default build holds no failpoint code: neither the names nor the
# CHARGED_FAILPOINT switch are in its charged binary. The test build (the one
# running this test, configured with CHARGED_FAILPOINTS=ON) holds both, which
# shows that the search below would find them if they were there.
set -euo pipefail
src=${CHARGED_SOURCE_DIR:?}
build=${CHARGED_BUILD_DIR:?}
tree=$build/default-options
# after_%s: the point after an operation executed, named after it
# (after_charge, after_refund).
names='after_claim|after_%s|after_persist|CHARGED_FAILPOINT'

cmake -S "$src" -B "$tree" -DCHARGED_WERROR=ON >/dev/null
cmake --build "$tree" --target charged -j2 >/dev/null

found=$(strings "$tree/worker/charged" | grep -E "$names" || true)
if [ -n "$found" ]; then
  echo "default build holds failpoint code:"; echo "$found"
  echo "0 passed, 1 failed"; exit 1
fi
if grep -q '^CHARGED_FAILPOINTS:BOOL=ON' "$build/CMakeCache.txt"; then
  n=$(strings "$build/worker/charged" | grep -cE "$names" || true)
  if [ "$n" -lt 4 ]; then
    echo "the test build should hold the failpoints, found $n names"
    echo "0 passed, 1 failed"; exit 1
  fi
fi
echo "1 passed, 0 failed"
