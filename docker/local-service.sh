# Shared by kafka-local.sh, registry-local.sh and prometheus-local.sh (sourced, not run): a service on
# 127.0.0.1 whose PID is kept in $pidfile. The sourcing script sets $name (its message
# prefix), $what (what it runs, for messages) and $pidfile first.

die() { echo "$name: $*" >&2; exit 1; }

is_running() {
  [[ -f "$pidfile" ]] && kill -0 "$(cat "$pidfile")" 2>/dev/null
}

port_open() {
  (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null
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
