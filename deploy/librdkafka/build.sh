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
# Usage: build.sh [PREFIX]   (default /opt/charged/librdkafka; absolute, the
#                            library's own directory)
#        build.sh --print-mirrors   the mirrors it would try, in order
#                            (CHARGED_APT_ETC: another /etc/apt to read)
# Does nothing when PREFIX already holds the pinned version.
set -euo pipefail

version=2.14.2
debian_revision=1
# The upstream tarball's SHA-256, as Debian's .dsc gives it: a second check
# beside apt's signed index, and a clear failure if the pin ever changes.
orig_sha256=4d53568c13717b167d12c7b2a0fe12aeb5d6bfe02de53df5b68f86d870a81b33
# Suites that carry it as a source package, newest first.
suites=(sid forky)

print_mirrors=0
if [ "${1:-}" = --print-mirrors ]; then
  print_mirrors=1
  shift
fi
prefix=${1:-${CHARGED_RDKAFKA_PREFIX:-/opt/charged/librdkafka}}
stamp="$prefix/.charged-librdkafka"
# The prefix is the library's alone: it is replaced whole on every build,
# so it must be absolute, and a directory this script did not make (say,
# /usr/local) is refused rather than emptied.
case $prefix in
  /*) ;;
  *) echo "librdkafka: the prefix must be an absolute path, not '$prefix'" >&2; exit 2 ;;
esac
prefix=${prefix%/}
if [ -e "$prefix" ] && [ ! -f "$stamp" ] && [ -n "$(ls -A "$prefix" 2>/dev/null)" ]; then
  echo "librdkafka: $prefix holds files this script did not install; give a prefix of its own" >&2
  exit 2
fi
if [ "$print_mirrors" = 0 ] && [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$version-$debian_revision" ] &&
  [ -s "$prefix/lib/librdkafka.so.1" ] && [ -s "$prefix/lib/pkgconfig/rdkafka.pc" ]; then
  exit 0
fi

# Candidate mirrors, in the order apt's own files give them: the machine's
# Debian sources first (sources.list, then the .sources files), third-party
# .list files last. Disabled deb822 stanzas are skipped. Each is tried in
# turn until one serves the pinned source package.
apt_etc=${CHARGED_APT_ETC:-/etc/apt}
sources=()
for f in "$apt_etc/sources.list" "$apt_etc"/sources.list.d/*.sources "$apt_etc"/sources.list.d/*.list; do
  [ -f "$f" ] && sources+=("$f")
done
mirrors=$( ((${#sources[@]})) && awk '
  function flush() { if (enabled && uris != "") print uris; uris = ""; enabled = 1 }
  BEGIN { enabled = 1 }
  FNR == 1 { flush() }
  /^[[:space:]]*$/ { flush(); next }
  /^[[:space:]]*deb[[:space:]]/ {
    for (i = 2; i <= NF; i++) if ($i ~ /^(https?|ftp):\/\//) { print $i; break }
    next
  }
  tolower($1) == "uris:" { for (i = 2; i <= NF; i++) if ($i ~ /^(https?|ftp):\/\//) uris = uris (uris == "" ? "" : "\n") $i }
  tolower($1) == "enabled:" && tolower($2) == "no" { enabled = 0 }
  END { flush() }
' "${sources[@]}" | awk '!seen[$0]++')
if [ -z "$mirrors" ]; then
  echo "librdkafka: no http(s) mirror found in the machine's apt sources" >&2
  exit 1
fi
if [ "$print_mirrors" = 1 ]; then
  echo "$mirrors"
  exit 0
fi

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
fetched=""
for mirror in $mirrors; do
  rm -rf "$work/lists" "$work/cache"
  mkdir -p "$work/lists/partial" "$work/cache/archives/partial"
  for s in "${suites[@]}"; do
    echo "deb-src [signed-by=/usr/share/keyrings/debian-archive-keyring.gpg] $mirror $s main"
  done >"$work/sources.list"
  apt_private=(
    -o "Dir::Etc::SourceList=$work/sources.list" -o Dir::Etc::SourceParts=/dev/null
    -o "Dir::State::Lists=$work/lists" -o "Dir::Cache=$work/cache"
    -o APT::Sandbox::User=root
  )
  if apt-get "${apt_private[@]}" -qq update >"$work/update.log" 2>&1 &&
    (cd "$work" && apt-get "${apt_private[@]}" -qq --download-only source \
      "librdkafka=$version-$debian_revision") >"$work/source.log" 2>&1; then
    fetched=$mirror
    break
  fi
done
if [ -z "$fetched" ]; then
  echo "librdkafka: no mirror of the machine's apt sources serves the source package" \
    "librdkafka $version-$debian_revision in ${suites[*]}; the last said:" >&2
  tail -5 "$work/update.log" "$work/source.log" >&2 2>/dev/null || true
  exit 1
fi
echo "librdkafka: fetched the source package $version-$debian_revision"
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
# Installed into a scratch root (DESTDIR keeps the configured paths in the
# pkg-config file), copied beside the prefix, then swapped in: a failed
# install leaves the previous library whole.
make -C src install DESTDIR="$work/root" >"$work/install.log" 2>&1 ||
  { tail -40 "$work/install.log" >&2; exit 1; }
staging="$prefix.new.$$"
rm -rf "$staging"
mkdir -p "$(dirname "$prefix")"
cp -a "$work/root$prefix" "$staging"
echo "$version-$debian_revision" >"$staging/.charged-librdkafka"
[ -e "$prefix" ] && mv "$prefix" "$prefix.old.$$"
mv "$staging" "$prefix"
rm -rf "$prefix.old.$$"
echo "librdkafka: $version installed in $prefix"
