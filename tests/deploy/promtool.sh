#!/bin/sh
# Runs Debian's promtool with the arguments given, from deploy/prometheus.
# Without promtool the test fails, never skips: deploy/install-deps.sh
# installs it (package prometheus).
if ! command -v promtool >/dev/null 2>&1; then
  echo "promtool not found: run deploy/install-deps.sh (Debian package prometheus)" >&2
  echo "0 passed, 1 failed"
  exit 1
fi
cd "$(dirname "$0")/../../deploy/prometheus" || exit 1
exec promtool "$@"
