#!/usr/bin/env bash
# Builds the pinned librdkafka from Debian's own source package into a
# prefix that CMake finds through pkg-config (CMakeLists.txt looks there).
#
# Why not bookworm's librdkafka-dev: 2.0.2 cannot talk to Kafka 4.x and has
# cooperative-rebalance bugs fixed upstream by 2.10. Debian's archive has a
# current one as a source package only (sid), so it is fetched with
# `apt-get source` under a private apt configuration whose deb-src entry
# reuses the mirror this machine's (or image's) own apt sources name: no
# host name is written anywhere. Built with upstream's configure against the
# system's libssl, zlib, zstd, lz4, sasl and curl.
#
# Usage: build.sh [PREFIX]   (default /opt/charged/librdkafka)
# Does nothing when PREFIX already holds the pinned version.
set -euo pipefail

version=2.14.2
debian_revision=1
# The upstream tarball's SHA-256, as Debian's .dsc gives it: a second check
# beside apt's signed index, and a clear failure if the pin ever changes.
orig_sha256=4d53568c13717b167d12c7b2a0fe12aeb5d6bfe02de53df5b68f86d870a81b33
# Suites that carry it as a source package, newest first.
suites=(sid forky)

prefix=${1:-${CHARGED_RDKAFKA_PREFIX:-/opt/charged/librdkafka}}
stamp="$prefix/.charged-librdkafka"
if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$version-$debian_revision" ] &&
  [ -f "$prefix/lib/librdkafka.so.1" ] && [ -f "$prefix/lib/pkgconfig/rdkafka.pc" ]; then
  exit 0
fi

sources=()
for f in /etc/apt/sources.list /etc/apt/sources.list.d/*.list /etc/apt/sources.list.d/*.sources; do
  [ -f "$f" ] && sources+=("$f")
done
# The first mirror that serves Debian's main archive (not the security one).
mirror=$(awk '
  /^[[:space:]]*deb[[:space:]]/ { for (i = 2; i <= NF; i++) if ($i ~ /^(https?|ftp):\/\//) { print $i; exit } }
  /^URIs:/ { for (i = 2; i <= NF; i++) if ($i !~ /security/) { print $i; exit } }
' "${sources[@]}" | grep -v security | head -1)
if [ -z "$mirror" ]; then
  echo "librdkafka: no Debian mirror found in the machine's apt sources" >&2
  exit 1
fi

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
mkdir -p "$work/lists/partial" "$work/cache/archives/partial"
for s in "${suites[@]}"; do
  echo "deb-src [signed-by=/usr/share/keyrings/debian-archive-keyring.gpg] $mirror $s main"
done >"$work/sources.list"
apt_private=(
  -o "Dir::Etc::SourceList=$work/sources.list" -o Dir::Etc::SourceParts=/dev/null
  -o "Dir::State::Lists=$work/lists" -o "Dir::Cache=$work/cache"
  -o APT::Sandbox::User=root
)
echo "librdkafka: fetching the source package $version-$debian_revision"
apt-get "${apt_private[@]}" -qq update
(cd "$work" && apt-get "${apt_private[@]}" -qq --download-only source "librdkafka=$version-$debian_revision")
orig="$work/librdkafka_$version.orig.tar.gz"
if ! echo "$orig_sha256  $orig" | sha256sum -c --quiet -; then
  echo "librdkafka: $orig does not have the pinned checksum" >&2
  exit 1
fi
# Upstream's tree as released: Debian's patches only add switches for
# external cJSON and nanopb, which bookworm does not package.
mkdir "$work/src"
tar -C "$work/src" --strip-components=1 -xzf "$orig"
cd "$work/src"

echo "librdkafka: building $version into $prefix"
./configure --prefix="$prefix" --enable-ssl --enable-zlib --enable-zstd \
  --enable-lz4-ext --enable-gssapi --enable-curl \
  >"$work/configure.log" 2>&1 ||
  { tail -40 "$work/configure.log" >&2; exit 1; }
# The C library only: charged has no C++.
make -C src -j"$(nproc)" >"$work/make.log" 2>&1 || { tail -40 "$work/make.log" >&2; exit 1; }
rm -rf "$prefix"
make -C src install >"$work/install.log" 2>&1 || { tail -40 "$work/install.log" >&2; exit 1; }
echo "$version-$debian_revision" >"$stamp"
echo "librdkafka: $version installed in $prefix"
