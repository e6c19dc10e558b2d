# Shared by kafka-local.sh, registry-local.sh and prometheus-local.sh (sourced, not run): a service on
# 127.0.0.1 whose PID is kept in $pidfile. The sourcing script sets $name (its message
# prefix), $what (what it runs, for messages), $pidfile, $log, $port and $wait_s first,
# and defines `ready` before calling await_ready.

die() { echo "$name: $*" >&2; exit 1; }

is_running() {
  [[ -f "$pidfile" ]] && kill -0 "$(cat "$pidfile")" 2>/dev/null
}

port_open() {
  (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null
}

# Whether GET PATH on 127.0.0.1:$port answers 200. No curl on a bare machine, so bash's
# own /dev/tcp speaks the one HTTP request.
http_ok() {
  local status
  status="$(
    { exec 3<>"/dev/tcp/127.0.0.1/$port"; } 2>/dev/null || exit 1
    printf 'GET %s HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n' "$1" >&3
    head -n 1 <&3
  )" || return 1
  [[ "$status" == *" 200"* ]]
}

# After a start: wait up to $wait_s for the sourcing script's `ready` to succeed; if the
# service exits or times out, its log's tail and one line naming it.
await_ready() {
  local deadline=$((SECONDS + wait_s))
  until ready; do
    if ! is_running; then
      tail -n 30 "$log" >&2
      die "$what exited during start-up (log: $log)"
    fi
    if ((SECONDS > deadline)); then
      stop >/dev/null 2>&1 || true
      die "$what was not ready within ${wait_s}s (log: $log)"
    fi
    sleep 0.25
  done
}

# SIGTERM, up to 30 s to exit, then SIGKILL; only the PID this script started.
stop() {
  if ! is_running; then
    rm -f "$pidfile"
    echo "$name: not running" >&2
    return 0
  fi
  local pid
  pid="$(cat "$pidfile")"
  kill "$pid"
  for _ in $(seq 1 60); do
    kill -0 "$pid" 2>/dev/null || break
    sleep 0.5
  done
  if kill -0 "$pid" 2>/dev/null; then
    echo "$name: $what did not stop in 30s; killing pid $pid" >&2
    kill -9 "$pid" 2>/dev/null || true
  fi
  rm -f "$pidfile"
  echo "$name: stopped" >&2
}
