#!/usr/bin/env bash
# Fetches Apache Kafka (see pom.xml for the version) and its runtime
# dependencies into deploy/kafka/jars. Does nothing when they are there.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
jars=${CHARGED_KAFKA_JARS:-$here/jars}
version=$(sed -n 's:.*<kafka.version>\(.*\)</kafka.version>.*:\1:p' "$here/pom.xml")

if [ -f "$jars/kafka_2.13-$version.jar" ] && [ -f "$jars/kafka-tools-$version.jar" ]; then
  exit 0
fi
echo "fetch-jars: fetching Kafka $version into $jars"
rm -rf "$jars.tmp"
mvn -q -B -Dstyle.color=never -f "$here/pom.xml" dependency:copy-dependencies \
  -DincludeScope=runtime -DoutputDirectory="$jars.tmp"
rm -rf "$jars"
mv "$jars.tmp" "$jars"
rm -rf "$here/target"
