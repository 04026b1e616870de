#!/bin/sh
# Fail unless Java 17+ is there: Spark 4 needs it. `make setup` runs this before pip, so a missing or old
# Java is reported at once rather than after minutes of downloads.
#
# Uses $JAVA_HOME/bin/java when JAVA_HOME is set (Spark's launcher does the same), else `java` on PATH.
# Shell built-ins only: it runs before the venv exists, and tests run it with a PATH holding only a fake java.

need=17
hint="install openjdk-$need-jre-headless (e.g. apt-get install openjdk-$need-jre-headless) or point JAVA_HOME at a Java $need+"

fail() {
  echo "Java $need+ is needed by Spark: $1; $hint" >&2
  exit 1
}

if [ -n "${JAVA_HOME:-}" ]; then
  java="$JAVA_HOME/bin/java"
  [ -x "$java" ] || fail "JAVA_HOME is $JAVA_HOME but it has no bin/java"
else
  java=$(command -v java) || fail "Java is missing (no \`java\` on PATH, JAVA_HOME not set)"
fi

# `java -version` writes to stderr, e.g. `openjdk version "17.0.15" 2025-04-15` or `java version "1.8.0_392"`.
out=$("$java" -version 2>&1) || fail "\`$java -version\` failed: $out"
q='"'
case $out in
  *"version $q"*) ;;
  *) fail "no version in the output of \`$java -version\`: $out" ;;
esac
version=${out#*version $q}
version=${version%%$q*}
major=${version#1.}  # Java 8 and older call themselves 1.x
major=${major%%[!0-9]*}
[ -n "$major" ] || fail "could not read a version from \`$java -version\`: $out"
[ "$major" -ge "$need" ] || fail "found $major (\"$version\" from \`$java -version\`)"
echo "Java $version ($java): ok"
