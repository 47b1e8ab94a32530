#!/usr/bin/env bash
# The demo: the main job of charged on the local stack.
set -euo pipefail
repo=$(cd "$(dirname "$0")/.." && pwd)
cd "$repo"
deploy/install-deps.sh
cmake -S . -B build >/dev/null
cmake --build build -j2 >/dev/null
deploy/stack.sh up
eval "$(deploy/stack.sh env)"
build/worker/chargectl migrate
echo "demo: the stack is up and migrated; the charge worker arrives with the next issue."
