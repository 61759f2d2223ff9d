#!/usr/bin/env bash
# A throwaway PostgreSQL cluster for the tests (Debian's postgresql package):
#   scripts/pg_cluster.sh start STATE   initdb in a fresh /tmp dir, start it on a unix socket in
#                                       that dir (no TCP port), create database `gpuprof`; writes
#                                       the libpq URL (line 1) and the dir (line 2) to STATE
#   scripts/pg_cluster.sh stop STATE    stop it and delete the dir (idempotent)
# As root (CI containers) the server runs as the `postgres` user, which initdb requires.
set -euo pipefail
cmd="${1:-}"; state="${2:-}"
[ -n "$cmd" ] && [ -n "$state" ] || { echo "usage: $0 start|stop STATE_FILE" >&2; exit 2; }

bindir=""
for d in /usr/lib/postgresql/*/bin; do [ -x "$d/initdb" ] && bindir="$d"; done
as_pg() {
  if [ "$(id -u)" -eq 0 ]; then runuser -u postgres -- "$@"; else "$@"; fi
}

stop() {
  [ -f "$state" ] || return 0
  local dir; dir="$(sed -n 2p "$state")"
  if [ -n "$dir" ] && [ -d "$dir" ]; then
    as_pg "$bindir/pg_ctl" -D "$dir/data" -m immediate -w stop >/dev/null 2>&1 || true
    rm -rf "$dir"
  fi
  rm -f "$state"
}

case "$cmd" in
  start)
    if [ -z "$bindir" ]; then
      echo "pg_cluster: no initdb under /usr/lib/postgresql/*/bin: apt-get install postgresql" >&2
      exit 1
    fi
    stop  # a cluster left behind by an interrupted run
    dir="$(mktemp -d /tmp/gpuprof-pg.XXXXXX)"
    chmod 755 "$dir"
    [ "$(id -u)" -eq 0 ] && chown postgres "$dir"
    as_pg "$bindir/initdb" -D "$dir/data" -U gpuprof -A trust -E UTF8 --locale=C.UTF-8 \
      --no-sync --no-instructions >"$dir/initdb.log" 2>&1 \
      || { cat "$dir/initdb.log" >&2; rm -rf "$dir"; exit 1; }
    as_pg "$bindir/pg_ctl" -D "$dir/data" -l "$dir/server.log" -w -t 60 \
      -o "-k $dir -c listen_addresses='' -c fsync=off -c full_page_writes=off -c max_connections=200" \
      start >/dev/null || { cat "$dir/server.log" >&2; rm -rf "$dir"; exit 1; }
    as_pg "$bindir/createdb" -h "$dir" -U gpuprof gpuprof
    printf 'postgresql:///gpuprof?host=%s&user=gpuprof\n%s\n' "$dir" "$dir" > "$state"
    echo "pg_cluster: PostgreSQL $("$bindir/postgres" --version | awk '{print $3}') at $dir"
    ;;
  stop) stop ;;
  *) echo "usage: $0 start|stop STATE_FILE" >&2; exit 2 ;;
esac
