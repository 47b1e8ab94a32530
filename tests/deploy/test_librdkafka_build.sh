#!/usr/bin/env bash
# deploy/librdkafka/build.sh without building: which mirrors it would try,
# from apt sources of every form (one-line with options, deb822 with several
# URIs, a disabled stanza, a security source first, a third-party list), and
# the prefixes it refuses before touching anything (relative; a directory
# holding files it did not install, which it must leave as it was).
set -euo pipefail
repo=${CHARGED_SOURCE_DIR:-$(cd "$(dirname "$0")/../.." && pwd)}
build=$repo/deploy/librdkafka/build.sh
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fail() { echo "FAIL: $*" >&2; exit 1; }
passed=0

etc=$tmp/apt
mkdir -p "$etc/sources.list.d"
cat >"$etc/sources.list" <<'SRC'
# comment
deb [arch=amd64 signed-by=/k.gpg] http://security.example.invalid/debian-security bookworm-security main
deb http://one.example.invalid/debian bookworm main
SRC
cat >"$etc/sources.list.d/debian.sources" <<'SRC'
Types: deb
URIs: http://two.example.invalid/debian https://three.example.invalid/debian
Suites: bookworm bookworm-updates
Components: main

Types: deb
uris: http://disabled.example.invalid/debian
Suites: bookworm
Components: main
Enabled: no
SRC
cat >"$etc/sources.list.d/vendor.list" <<'SRC'
deb https://vendor.example.invalid/apt stable main
SRC
got=$(CHARGED_APT_ETC=$etc "$build" --print-mirrors | tr '\n' ' ')
want="http://security.example.invalid/debian-security http://one.example.invalid/debian http://two.example.invalid/debian https://three.example.invalid/debian https://vendor.example.invalid/apt "
[ "$got" = "$want" ] || fail "mirrors: got '$got', want '$want'"
passed=$((passed + 1))

empty=$tmp/empty-apt
mkdir -p "$empty/sources.list.d"
echo "deb cdrom:[Debian]/ bookworm main" >"$empty/sources.list"
if out=$(CHARGED_APT_ETC=$empty "$build" --print-mirrors 2>&1); then
  fail "no http mirror: want a failure, got '$out'"
fi
grep -q "no http(s) mirror" <<<"$out" || fail "no http mirror: said '$out'"
passed=$((passed + 1))

set +e
out=$("$build" relative/prefix 2>&1); rc=$?
set -e
[ "$rc" -eq 2 ] && grep -q "absolute path" <<<"$out" || fail "relative prefix: rc $rc, '$out'"
passed=$((passed + 1))

foreign=$tmp/usr-local
mkdir -p "$foreign/bin"
echo keep >"$foreign/bin/tool"
set +e
out=$("$build" "$foreign" 2>&1); rc=$?
set -e
[ "$rc" -eq 2 ] && grep -q "did not install" <<<"$out" || fail "foreign prefix: rc $rc, '$out'"
[ "$(cat "$foreign/bin/tool")" = keep ] || fail "foreign prefix: its files were touched"
passed=$((passed + 1))

echo "$passed passed, 0 failed"
