#!/usr/bin/env bash
# Make the test PostgreSQL answer on 127.0.0.1:5432 as user `postgres` with trust auth and
# wal_level = logical (Debezium's pgoutput needs it). Called by `make test-deps`.
#
# Idempotent: a server already answering as the tests need is left alone, and the script
# says it reuses it; one that answers but refuses the tests' login (user postgres, trust
# auth, a superuser) is reported, not reconfigured. Otherwise Debian's PostgreSQL
# is installed if missing, and a cluster of the tests' own (Debian's `main`, its auth and its
# settings, stay as they are) is created with trust auth and started.
set -euo pipefail

HOST=127.0.0.1
PORT=5432
CLUSTER=icespool_tests
SUDO=""
[ "$(id -u)" = 0 ] || SUDO=sudo

fail() {
  echo "error: the test PostgreSQL on $HOST:$PORT: $*" >&2
  exit 1
}

query() {
  psql "host=$HOST port=$PORT user=postgres dbname=postgres connect_timeout=5" -Atqc "$1" \
    2>/dev/null
}

# The client first: whether a server already answers is asked with it.
if ! command -v pg_isready >/dev/null || ! command -v psql >/dev/null; then
  echo "installing the PostgreSQL client from Debian's packages"
  $SUDO apt-get update -qq || fail "apt-get update failed"
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends \
    postgresql-client >/dev/null || fail "apt-get install postgresql-client failed"
fi

if pg_isready -q -h "$HOST" -p "$PORT" -t 3; then
  # Not ours (or ours from an earlier run): reused as it is, so say so, and check that the
  # tests can use it the way they do: user postgres, no password, a superuser.
  super="$(query 'SELECT rolsuper FROM pg_roles WHERE rolname = current_user')" \
    || fail "a server answers but refuses 'psql -h $HOST -U postgres' without a password; \
the tests need trust auth for user postgres on $HOST (its pg_hba.conf), or stop that \
server and rerun to get the tests' own"
  [ "$super" = t ] || fail "a server answers, but user postgres is not a superuser there; \
the tests create databases, roles and replication slots"
  level="$(query 'SHOW wal_level')"
  if [ "$level" != logical ]; then
    echo "warning: the test PostgreSQL on $HOST:$PORT runs with wal_level=$level;" \
      "the Debezium tests need wal_level=logical" >&2
  fi
  cluster="$(query 'SHOW cluster_name')"
  version="$(query 'SHOW server_version')"
  if [ "${cluster#*/}" = "$CLUSTER" ]; then
    echo "test PostgreSQL: the tests' own cluster $cluster already runs on $HOST:$PORT" \
      "($version, wal_level=$level)"
  else
    echo "test PostgreSQL: REUSING a server that is not the tests' own, already answering" \
      "on $HOST:$PORT (cluster '${cluster:-unnamed}', $version, wal_level=$level): trust" \
      "auth for superuser postgres works there; stop it to get the tests' own instead"
  fi
  exit 0
fi

if ! command -v pg_ctlcluster >/dev/null || ! ls /usr/lib/postgresql/*/bin/postgres >/dev/null 2>&1; then
  echo "installing PostgreSQL from Debian's packages"
  $SUDO apt-get update -qq || fail "apt-get update failed"
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends \
    postgresql postgresql-client >/dev/null || fail "apt-get install postgresql failed"
  # Where an init system runs, the package starts Debian's `main` cluster on this port.
  if pg_lsclusters -h | awk '$2 == "main" && $4 == "online"' | grep -q .; then
    $SUDO pg_ctlcluster "$(pg_lsclusters -h | awk '$2 == "main" {print $1; exit}')" main stop
  fi
fi

version="$(ls /usr/lib/postgresql | sort -V | tail -n 1)"
[ -n "$version" ] || fail "no server under /usr/lib/postgresql after the install"
log="/var/log/postgresql/postgresql-$version-$CLUSTER.log"
cluster_status() {
  pg_lsclusters -h | awk -v v="$version" -v c="$CLUSTER" '$1 == v && $2 == c {print $4}'
}
if [ -z "$(cluster_status)" ]; then
  $SUDO pg_createcluster "$version" "$CLUSTER" --port "$PORT" -- --auth=trust >/dev/null \
    || fail "pg_createcluster $version $CLUSTER failed"
fi
conf_dir="/etc/postgresql/$version/$CLUSTER"
$SUDO mkdir -p "$conf_dir/conf.d"
$SUDO tee "$conf_dir/conf.d/icespool-tests.conf" >/dev/null <<EOF
# Written by icespool's tests/support/postgres_up.sh.
listen_addresses = '$HOST'
port = $PORT
wal_level = logical
max_wal_senders = 10
max_replication_slots = 10
# Two xdist workers, each with daemons, Spark and Kafka Connect holding connection pools.
max_connections = 300
# A throwaway test server: the tests kill daemons, never PostgreSQL.
fsync = off
synchronous_commit = off
full_page_writes = off
EOF

if [ "$(cluster_status)" = online ]; then
  $SUDO pg_ctlcluster "$version" "$CLUSTER" restart || fail "restart failed; see $log"
else
  $SUDO pg_ctlcluster "$version" "$CLUSTER" start || fail "start failed; see $log"
fi
for _ in $(seq 1 60); do
  pg_isready -q -h "$HOST" -p "$PORT" -t 1 && break
  sleep 0.5
done
level="$(query 'SHOW wal_level')" || fail "started, but 'psql -h $HOST -U postgres' fails; see $log"
echo "test PostgreSQL $version: running on $HOST:$PORT (cluster $CLUSTER, trust, wal_level=$level)"
