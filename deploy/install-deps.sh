#!/usr/bin/env bash
# Installs what charged needs to build, test and run its local stack on a
# Debian machine, and fetches Apache Kafka's jars from Maven Central.
# Does nothing when everything is already present.
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)

packages=(
  build-essential cmake pkg-config
  librdkafka-dev libpq-dev libjansson-dev uuid-dev check
  libcurl4-openssl-dev libmicrohttpd-dev libssl-dev
  postgresql default-jdk-headless maven kcat
  python3 clang-format valgrind
)

missing=()
for p in "${packages[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed'; then
    missing+=("$p")
  fi
done
# A JDK from elsewhere (the image's own) will do for default-jdk-headless.
if command -v java >/dev/null 2>&1; then
  missing=("${missing[@]/default-jdk-headless}")
fi
want=()
for p in "${missing[@]}"; do [ -n "$p" ] && want+=("$p"); done

if [ ${#want[@]} -gt 0 ]; then
  echo "install-deps: installing ${want[*]}"
  sudo=""
  [ "$(id -u)" -ne 0 ] && sudo="sudo"
  $sudo apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends "${want[@]}" >/dev/null
fi

"$here/kafka/fetch-jars.sh"
