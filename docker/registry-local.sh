#!/usr/bin/env bash
# A real Schema Registry on 127.0.0.1 for tests and local runs without a Docker engine:
# Apicurio Registry (Apache-2.0) with in-memory storage, serving the Confluent-compatible
# API at http://127.0.0.1:PORT/apis/ccompat/v7.
#
#   docker/registry-local.sh start|stop|status|url|fetch
#
# Environment:
#   KASCADE_REGISTRY_PORT   HTTP port (default 8081)
#   KASCADE_REGISTRY_HOME   state folder: distribution, log, pid (default <repo>/.cache/registry-local)
#   KASCADE_REGISTRY_WAIT   seconds to wait for it to answer (default 90)
#
# The distribution comes from Maven Central (checksum-verified by Maven) and is cached
# in KASCADE_REGISTRY_HOME/dist, so only the first start downloads anything. Its parent
# POM is not on every mirror, so the artifact is copied by coordinate, without it.
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
repo="$(cd "$here/.." && pwd)"
version=3.0.9
artifact="io.apicurio:apicurio-registry-app:$version:tar.gz:all"
port="${KASCADE_REGISTRY_PORT:-8081}"
home="${KASCADE_REGISTRY_HOME:-$repo/.cache/registry-local}"
wait_s="${KASCADE_REGISTRY_WAIT:-90}"
dist="$home/dist-$version"
run="$home/registry-$port"
pidfile="$run/registry.pid"
log="$run/registry.log"
ready_path=/apis/ccompat/v7/subjects

name=registry-local
what=registry
# shellcheck source=local-service.sh
source "$here/local-service.sh"

# When the Confluent-compatible API answers.
ready() {
  http_ok "$ready_path"
}

fetch() {
  [[ -f "$dist/.complete" ]] && return 0
  command -v mvn >/dev/null || die "Maven (mvn) is needed to fetch Apicurio Registry"
  command -v java >/dev/null || die "Java 17+ is needed to run Apicurio Registry"
  local tmp="$dist.tmp.$$"
  rm -rf "$tmp"
  mkdir -p "$tmp"
  echo "registry-local: fetching Apicurio Registry $version from Maven Central into $dist" >&2
  mvn -q -B dependency:copy -Dartifact="$artifact" -DoutputDirectory="$tmp" >&2 \
    || { rm -rf "$tmp"; die "could not fetch $artifact with Maven"; }
  tar -xzf "$tmp"/apicurio-registry-app-*.tar.gz -C "$tmp" \
    || { rm -rf "$tmp"; die "could not unpack the Apicurio Registry distribution"; }
  rm -f "$tmp"/apicurio-registry-app-*.tar.gz
  touch "$tmp/.complete"
  rm -rf "$dist"
  mv "$tmp" "$dist"   # rename, so an interrupted fetch never looks complete
}

start() {
  if is_running; then
    echo "registry-local: already running on 127.0.0.1:$port (pid $(cat "$pidfile"))" >&2
    return 0
  fi
  port_open "$port" && die "port $port is taken by another process; set KASCADE_REGISTRY_PORT"
  fetch
  mkdir -p "$run"
  : >"$log"
  # exec in the subshell, so $! is the JVM's own PID and stop signals the registry itself.
  (
    cd "$run"
    export QUARKUS_HTTP_PORT="$port" QUARKUS_HTTP_HOST=127.0.0.1
    exec java -Xms64m -Xmx512m -jar "$dist/apicurio-registry-app-$version-runner.jar"
  ) >>"$log" 2>&1 </dev/null &
  echo $! >"$pidfile"
  await_ready
  echo "registry-local: running on http://127.0.0.1:$port (pid $(cat "$pidfile"))" >&2
}

case "${1:-}" in
  start) start ;;
  stop) stop ;;
  status)
    if is_running; then echo "running on http://127.0.0.1:$port (pid $(cat "$pidfile"))"; else echo "stopped"; exit 3; fi ;;
  url) echo "http://127.0.0.1:$port/apis/ccompat/v7" ;;
  fetch) fetch ;;
  *) echo "usage: $0 start|stop|status|url|fetch" >&2; exit 2 ;;
esac
