#!/usr/bin/env bash
# The unit tests of common/core link none of the I/O libraries: no
# librdkafka, libpq, libcurl or libmicrohttpd among the shared libraries
# each binary needs (readelf -d, NEEDED). Usage: test_core_links.sh
# CONTROL BINARY...; CONTROL (the charged binary) needs all four, which shows
# that the search below would find them if they were there.
set -euo pipefail
io='^(librdkafka|libpq|libcurl|libmicrohttpd)\.'
control=${1:?usage: test_core_links.sh CONTROL BINARY...}
shift
[ $# -gt 0 ] || { echo "no binaries given"; echo "0 passed, 1 failed"; exit 1; }

needed() {
  readelf -d "$1" | sed -n 's/.*(NEEDED).*\[\(.*\)\]/\1/p'
}

passed=0 failed=0
n=$(needed "$control" | grep -cE "$io" || true)
if [ "$n" -ne 4 ]; then
  echo "$control should need the four I/O libraries, found $n:"; needed "$control"
  failed=$((failed + 1))
else
  passed=$((passed + 1))
fi
for bin in "$@"; do
  found=$(needed "$bin" | grep -E "$io" || true)
  if [ -n "$found" ]; then
    echo "$(basename "$bin") links an I/O library:" $found
    failed=$((failed + 1))
  else
    passed=$((passed + 1))
  fi
done
echo "$passed passed, $failed failed"
[ "$failed" -eq 0 ]
