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

# "200" when the Confluent-compatible API answers; no curl on a bare machine, so bash's
# own /dev/tcp speaks the one HTTP request.
ready() {
  local status
  status="$(
    { exec 3<>"/dev/tcp/127.0.0.1/$port"; } 2>/dev/null || exit 1
    printf 'GET %s HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n' "$ready_path" >&3
    head -n 1 <&3
  )" || return 1
  [[ "$status" == *" 200"* ]]
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
  local deadline=$((SECONDS + wait_s))
  until ready; do
    if ! is_running; then
      tail -n 30 "$log" >&2
      die "registry exited during start-up (log: $log)"
    fi
    if ((SECONDS > deadline)); then
      stop >/dev/null 2>&1 || true
      die "registry did not answer within ${wait_s}s (log: $log)"
    fi
    sleep 0.25
  done
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
