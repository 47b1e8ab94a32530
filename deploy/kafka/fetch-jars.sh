#!/usr/bin/env bash
# Fetches Apache Kafka and its runtime dependencies from Maven Central into
# deploy/kafka/jars/VERSION. Does nothing when they are there.
#
# Usage: fetch-jars.sh [VERSION]   (default: pom.xml's kafka.version;
#                                   "compat": its kafka.compat.version)
# Prints the directory the jars are in.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
pom_property() { sed -n "s:.*<$1>\(.*\)</$1>.*:\1:p" "$here/pom.xml"; }
version=${1:-$(pom_property kafka.version)}
[ "$version" = compat ] && version=$(pom_property kafka.compat.version)
jars=${CHARGED_KAFKA_JARS_ROOT:-$here/jars}/$version

if [ -f "$jars/kafka_2.13-$version.jar" ] && [ -f "$jars/kafka-tools-$version.jar" ]; then
  echo "$jars"
  exit 0
fi
case $version in
  3.*) profile=kafka3 ;;
  4.*) profile=kafka4 ;;
  *) echo "fetch-jars: Kafka $version: no logging profile for that major version" >&2; exit 1 ;;
esac
echo "fetch-jars: fetching Kafka $version into $jars" >&2
rm -rf "$jars.tmp"
mvn -q -B -Dstyle.color=never -f "$here/pom.xml" -P "$profile" -Dkafka.version="$version" \
  dependency:copy-dependencies -DincludeScope=runtime -DoutputDirectory="$jars.tmp" >&2
rm -rf "$jars"
mv "$jars.tmp" "$jars"
rm -rf "$here/target"
echo "$jars"
