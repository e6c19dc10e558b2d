#!/usr/bin/env bash
# A real Prometheus on 127.0.0.1 for tests and local runs without a Docker engine:
# Debian's `prometheus` package (the server binary only, unpacked into a cache folder,
# so nothing is installed system-wide and no service starts by itself).
#
#   docker/prometheus-local.sh start CONFIG|stop|status|url|fetch
#
# Environment:
#   KASCADE_PROMETHEUS_PORT   HTTP port (default 9090)
#   KASCADE_PROMETHEUS_HOME   state folder: binary, data, log, pid (default <repo>/.cache/prometheus-local)
#   KASCADE_PROMETHEUS_WAIT   seconds to wait for it to be ready (default 60)
#
# CONFIG is a Prometheus configuration file (docker/prometheus.yml is compose's). The
# package comes from the machine's Debian mirror (apt-get download, then dpkg -x) and is
# cached in KASCADE_PROMETHEUS_HOME/dist; a prometheus already on PATH is used instead.
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
repo="$(cd "$here/.." && pwd)"
port="${KASCADE_PROMETHEUS_PORT:-9090}"
home="${KASCADE_PROMETHEUS_HOME:-$repo/.cache/prometheus-local}"
wait_s="${KASCADE_PROMETHEUS_WAIT:-60}"
dist="$home/dist"
run="$home/prometheus-$port"
pidfile="$run/prometheus.pid"
log="$run/prometheus.log"

name=prometheus-local
what=prometheus
# shellcheck source=local-service.sh
source "$here/local-service.sh"

binary() {
  if [[ -x "$dist/usr/bin/prometheus" ]]; then
    echo "$dist/usr/bin/prometheus"
  elif command -v prometheus >/dev/null; then
    command -v prometheus
  else
    return 1
  fi
}

ready() {
  http_ok /-/ready
}

fetch() {
  binary >/dev/null && return 0
  command -v apt-get >/dev/null || die "apt-get is needed to fetch Debian's prometheus package"
  local tmp="$dist.tmp.$$"
  rm -rf "$tmp"
  mkdir -p "$tmp"
  echo "prometheus-local: fetching Debian's prometheus package into $dist" >&2
  # apt-get download needs the package lists; a fresh machine may not have them yet.
  if ! (cd "$tmp" && apt-get download -q prometheus >&2 2>/dev/null); then
    apt-get update -q >&2 || die "apt-get update failed (it needs root)"
    (cd "$tmp" && apt-get download -q prometheus >&2) \
      || { rm -rf "$tmp"; die "could not download the prometheus package"; }
  fi
  dpkg -x "$tmp"/prometheus_*.deb "$tmp" || { rm -rf "$tmp"; die "could not unpack it"; }
  rm -f "$tmp"/prometheus_*.deb
  rm -rf "$dist"
  mv "$tmp" "$dist"   # rename, so an interrupted fetch never looks complete
}

start() {
  local config="${1:-}"
  [[ -f "$config" ]] || die "usage: $0 start CONFIG (a Prometheus configuration file)"
  if is_running; then
    echo "prometheus-local: already running on 127.0.0.1:$port (pid $(cat "$pidfile"))" >&2
    return 0
  fi
  port_open "$port" && die "port $port is taken by another process; set KASCADE_PROMETHEUS_PORT"
  fetch
  local bin
  bin="$(binary)"
  config="$(cd "$(dirname "$config")" && pwd)/$(basename "$config")"
  mkdir -p "$run/data"
  : >"$log"
  (
    cd "$run"
    exec "$bin" --config.file="$config" --storage.tsdb.path="$run/data" \
      --web.listen-address="127.0.0.1:$port" --web.enable-lifecycle
  ) >>"$log" 2>&1 </dev/null &
  echo $! >"$pidfile"
  await_ready
  echo "prometheus-local: running on http://127.0.0.1:$port (pid $(cat "$pidfile"))" >&2
}

case "${1:-}" in
  start) start "${2:-}" ;;
  stop) stop; rm -rf "$run/data" ;;
  status)
    if is_running; then echo "running on http://127.0.0.1:$port (pid $(cat "$pidfile"))"; else echo "stopped"; exit 3; fi ;;
  url) echo "http://127.0.0.1:$port" ;;
  fetch) fetch ;;
  *) echo "usage: $0 start CONFIG|stop|status|url|fetch" >&2; exit 2 ;;
esac
