#!/usr/bin/env bash
# A real single-node Apache Kafka broker (KRaft, broker+controller in one JVM) on
# 127.0.0.1, for tests and local runs on machines without a Docker engine.
#
#   docker/kafka-local.sh start|stop|status|bootstrap|fetch
#
# Environment:
#   KASCADE_KAFKA_PORT   client port (default 9092); the controller uses PORT+1, and
#                        PORT+2 is a SASL/PLAIN listener with ACLs enforced (users
#                        alice and bob, passwords alice-secret and bob-secret), for
#                        trying what an authorization failure looks like
#   KASCADE_KAFKA_HOME   state folder: jars, data, log, pid (default <repo>/.cache/kafka-local)
#   KASCADE_KAFKA_WAIT   seconds to wait for the broker to come up (default 90)
#
# The jars come from Maven Central through docker/kafka-local/pom.xml and are cached in
# KASCADE_KAFKA_HOME/libs, so only the first start downloads anything.
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
repo="$(cd "$here/.." && pwd)"
port="${KASCADE_KAFKA_PORT:-9092}"
home="${KASCADE_KAFKA_HOME:-$repo/.cache/kafka-local}"
wait_s="${KASCADE_KAFKA_WAIT:-90}"
libs="$home/libs"
run="$home/broker-$port"
pidfile="$run/broker.pid"
log="$run/broker.log"

name=kafka-local
what=broker
# shellcheck source=local-service.sh
source "$here/local-service.sh"

ready() {
  grep -q "Kafka Server started" "$log" 2>/dev/null && port_open "$port"
}

fetch() {
  [[ -f "$libs/.complete" ]] && return 0
  command -v mvn >/dev/null || die "Maven (mvn) is needed to fetch the Kafka jars"
  command -v java >/dev/null || die "Java 17+ is needed to run the broker"
  local tmp="$libs.tmp.$$"
  rm -rf "$tmp"
  echo "kafka-local: fetching Apache Kafka jars from Maven Central into $libs" >&2
  mvn -q -B -f "$here/kafka-local/pom.xml" dependency:copy-dependencies \
    -DincludeScope=runtime -DoutputDirectory="$tmp" >&2 \
    || { rm -rf "$tmp"; die "could not fetch the Kafka jars with Maven"; }
  touch "$tmp/.complete"
  rm -rf "$libs"
  mv "$tmp" "$libs"   # rename, so an interrupted fetch never looks complete
}

write_config() {
  mkdir -p "$run"
  cat >"$run/server.properties" <<PROPS
process.roles=broker,controller
node.id=1
controller.quorum.voters=1@127.0.0.1:$((port + 1))
listeners=PLAINTEXT://127.0.0.1:$port,CONTROLLER://127.0.0.1:$((port + 1)),SASL_PLAINTEXT://127.0.0.1:$((port + 2))
advertised.listeners=PLAINTEXT://127.0.0.1:$port,SASL_PLAINTEXT://127.0.0.1:$((port + 2))
controller.listener.names=CONTROLLER
listener.security.protocol.map=PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT,SASL_PLAINTEXT:SASL_PLAINTEXT
inter.broker.listener.name=PLAINTEXT
sasl.enabled.mechanisms=PLAIN
listener.name.sasl_plaintext.plain.sasl.jaas.config=org.apache.kafka.common.security.plain.PlainLoginModule required user_alice="alice-secret" user_bob="bob-secret";
# ACLs are enforced for the SASL users; the plaintext listener's anonymous clients (the
# tests, local runs) may do anything, and a resource without ACLs is open to all.
authorizer.class.name=org.apache.kafka.metadata.authorizer.StandardAuthorizer
super.users=User:ANONYMOUS
allow.everyone.if.no.acl.found=true
log.dirs=$run/data
num.partitions=1
offsets.topic.replication.factor=1
share.coordinator.state.topic.replication.factor=1
transaction.state.log.replication.factor=1
transaction.state.log.min.isr=1
group.initial.rebalance.delay.ms=0
auto.create.topics.enable=false
PROPS
  # INFO only for the line that says the server started; the rest stays quiet.
  cat >"$run/log4j2.properties" <<PROPS
rootLogger.level=WARN
rootLogger.appenderRef.out.ref=OUT
appender.out.type=Console
appender.out.name=OUT
appender.out.layout.type=PatternLayout
appender.out.layout.pattern=[%d] %p %m (%c)%n
logger.started.name=kafka.server.KafkaRaftServer
logger.started.level=INFO
PROPS
}

java_opts() {
  jvm=(java -Xms128m -Xmx768m -XX:+UseG1GC -Djava.awt.headless=true
    "-Dlog4j2.configurationFile=$run/log4j2.properties" -cp "$libs/*")
}

start() {
  if is_running; then
    echo "kafka-local: already running on 127.0.0.1:$port (pid $(cat "$pidfile"))" >&2
    return 0
  fi
  port_open "$port" && die "port $port is taken by another process; set KASCADE_KAFKA_PORT"
  fetch
  write_config
  java_opts
  if [[ ! -f "$run/data/meta.properties" ]]; then
    local cluster_id
    cluster_id="$("${jvm[@]}" kafka.tools.StorageTool random-uuid)"
    "${jvm[@]}" kafka.tools.StorageTool format -t "$cluster_id" -c "$run/server.properties" >/dev/null \
      || die "could not format KRaft storage in $run/data"
  fi
  : >"$log"
  # exec in the subshell, so $! is the JVM's own PID and stop signals the broker itself.
  (exec "${jvm[@]}" kafka.Kafka "$run/server.properties") >>"$log" 2>&1 </dev/null &
  echo $! >"$pidfile"
  await_ready
  echo "kafka-local: running on 127.0.0.1:$port (pid $(cat "$pidfile"))" >&2
}

case "${1:-}" in
  start) start ;;
  stop) stop ;;
  status)
    if is_running; then echo "running on 127.0.0.1:$port (pid $(cat "$pidfile"))"; else echo "stopped"; exit 3; fi ;;
  bootstrap) echo "127.0.0.1:$port" ;;
  fetch) fetch ;;
  *) echo "usage: $0 start|stop|status|bootstrap|fetch" >&2; exit 2 ;;
esac
