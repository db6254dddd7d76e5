#!/usr/bin/env bash
# Apache Kafka's released jars as a test reference: fetch them once with Maven, then run
# any of their main classes (the broker, StorageTool, the command-line tools).
#
#   bash reference/kafka/kit.sh fetch            # download into ~/.m2 (once) and write the classpath
#   bash reference/kafka/kit.sh classpath        # fetch if needed, print the classpath file's path
#   bash reference/kafka/kit.sh run CLASS ARGS   # e.g. run org.apache.kafka.tools.TopicCommand --help
#
# The classpath is written to target/classpath.txt next to this file, with the hash of
# pom.xml it was resolved from; while pom.xml is unchanged and every jar is still in
# ~/.m2, later calls neither run Maven nor touch the network. A failed fetch exits non-zero.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
target="$here/target"
cp_file="$target/classpath.txt"
stamp_file="$target/classpath.pom.sha256"

fresh() {
    [ -s "$cp_file" ] && [ -s "$stamp_file" ] || return 1
    [ "$(sha256sum "$here/pom.xml" | cut -d' ' -f1)" = "$(cat "$stamp_file")" ] || return 1
    local jar
    while IFS= read -r jar; do
        [ -f "$jar" ] || return 1
    done < <(tr ':' '\n' < "$cp_file")
}

fetch() {
    fresh && return 0
    command -v mvn >/dev/null 2>&1 || { echo "kit.sh: Maven (mvn) is not installed; it is needed to fetch Apache Kafka's jars" >&2; exit 1; }
    command -v java >/dev/null 2>&1 || { echo "kit.sh: Java (17+) is not installed" >&2; exit 1; }
    mkdir -p "$target"
    echo "kit.sh: fetching Apache Kafka's jars with Maven (once)" >&2
    local log="$target/mvn.log"
    if ! mvn -B -q -f "$here/pom.xml" dependency:build-classpath -Dmdep.outputFile="$cp_file.tmp" >"$log" 2>&1; then
        echo "kit.sh: Maven could not fetch Apache Kafka's jars:" >&2
        tail -40 "$log" >&2
        exit 1
    fi
    mv "$cp_file.tmp" "$cp_file"
    sha256sum "$here/pom.xml" | cut -d' ' -f1 > "$stamp_file"
}

cmd="${1:-fetch}"
case "$cmd" in
    fetch) fetch ;;
    classpath) fetch; echo "$cp_file" ;;
    run)
        shift
        [ $# -ge 1 ] || { echo "usage: kit.sh run CLASS [ARGS...]" >&2; exit 2; }
        fetch
        exec java -XX:TieredStopAtLevel=1 -XX:+UseSerialGC -Xss1m \
            -Dlog4j2.configurationFile="$here/log4j2.properties" \
            -cp "$(cat "$cp_file")" "$@" ;;
    *) echo "usage: kit.sh fetch | classpath | run CLASS [ARGS...]" >&2; exit 2 ;;
esac
