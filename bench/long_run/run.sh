#!/usr/bin/env bash
# Long-run storage benchmark: a synthetic HOURS-hour, GPUS-GPU run at 100 Hz written through the
# real write path (StoreWriter + the recorder's rollups, with the default raw retention), then
# `gpuprof insights` on it.
#
#   bench/long_run/run.sh [HOURS] [GPUS]        # default 24 8
#   UPDATE_DOCS=1 bench/long_run/run.sh 24 8    # also rewrite the figures in docs/benchmarks.md
#
# Reports: generation time, DB size and size per GPU-hour (with a per-table breakdown), and the
# wall time and max RSS of `gpuprof insights DB` (targets for 24 h x 8 GPUs: <= 10 s, <= 1 GiB).
# Builds into build/long_run (Release, -DGPUPROF_BUILD_BENCH=ON); the DB goes to
# build/long_run/long_run.db (override with DB=...), never into the source tree.
set -euo pipefail
cd "$(dirname "$0")/../.."

HOURS="${1:-24}"
GPUS="${2:-8}"
BUILD="${BUILD:-build/long_run}"
DB="${DB:-$BUILD/long_run.db}"

build_log="$(mktemp)"
if ! { cmake -S . -B "$BUILD" -G Ninja -DGPUPROF_BUILD_BENCH=ON -DCMAKE_BUILD_TYPE=Release &&
       ninja -C "$BUILD" long_run_gen gpuprof_cli; } >"$build_log" 2>&1; then
  cat "$build_log"
  exit 1
fi
rm -f "$build_log"
GEN="$BUILD/bench/long_run/long_run_gen"
GPUPROF="${GPUPROF:-$BUILD/cpp/cli/gpuprof}"

# "Elapsed (wall clock) time (h:mm:ss or m:ss): 1:02.5" -> seconds; "Maximum resident ..." -> KiB
wall_s() { awk -F': ' '/Elapsed \(wall clock\)/ {n = split($2, p, ":"); s = 0;
  for (i = 1; i <= n; i++) s = s * 60 + p[i]; printf "%.2f", s}' "$1"; }
rss_kib() { awk -F': ' '/Maximum resident set size/ {print $2}' "$1"; }

tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
rm -f "$DB" "$DB-wal" "$DB-shm"

echo "long_run: generating ${HOURS} h x ${GPUS} GPUs at 100 Hz into $DB"
/usr/bin/time -v "$GEN" --db "$DB" --hours "$HOURS" --gpus "$GPUS" >"$tmp/gen.out" 2>"$tmp/gen.time"
cat "$tmp/gen.out"
gen_s="$(wall_s "$tmp/gen.time")"
gen_rss="$(rss_kib "$tmp/gen.time")"

db_bytes="$(stat -c %s "$DB")"
gpu_hours="$(awk -v h="$HOURS" -v g="$GPUS" 'BEGIN {print h * g}')"
per_gpu_hour="$(awk -v b="$db_bytes" -v gh="$gpu_hours" 'BEGIN {printf "%.2f", b / gh / 1048576}')"
db_mib="$(awk -v b="$db_bytes" 'BEGIN {printf "%.1f", b / 1048576}')"
free_pages="$(sqlite3 "$DB" 'PRAGMA freelist_count')"
page_size="$(sqlite3 "$DB" 'PRAGMA page_size')"

# Bytes per table (its indexes included) and rows.
breakdown="$(sqlite3 -separator ' ' "$DB" "
  WITH sizes AS (
    SELECT coalesce(m.tbl_name, d.name) AS tbl, sum(d.pgsize) AS bytes
    FROM dbstat d LEFT JOIN sqlite_schema m ON m.name = d.name GROUP BY 1)
  SELECT tbl, bytes FROM sizes WHERE bytes > 65536 ORDER BY bytes DESC")"
table_rows() { sqlite3 "$DB" "SELECT count(*) FROM $1"; }

echo "long_run: gpuprof insights $DB"
/usr/bin/time -v "$GPUPROF" insights "$DB" >"$tmp/insights.out" 2>"$tmp/insights.time"
cat "$tmp/insights.out"
ins_s="$(wall_s "$tmp/insights.time")"
ins_rss="$(rss_kib "$tmp/insights.time")"
ins_mib="$(awk -v k="$ins_rss" 'BEGIN {printf "%.0f", k / 1024}')"

{
  echo "Command: \`bench/long_run/run.sh $HOURS $GPUS\` ($(nproc) cores, $(awk '/MemTotal/ {printf "%.0f GiB", $2 / 1048576}' /proc/meminfo), $(date -u +%Y-%m-%d))."
  echo
  echo "| figure | value |"
  echo "|---|---|"
  echo "| run | ${HOURS} h × ${GPUS} GPUs at 100 Hz, host at 5 Hz (64 cores, 8 workers), 1 step/s |"
  echo "| generate (\`long_run_gen\`, real StoreWriter + rollups) | $gen_s s, max RSS $((gen_rss / 1024)) MiB |"
  echo "| DB size | $db_mib MiB ($db_bytes bytes; $free_pages free pages of $page_size B) |"
  echo "| **DB size per GPU-hour** | **$per_gpu_hour MiB** |"
  echo "| \`gpuprof insights DB\` wall time | **$ins_s s** (target ≤ 10 s) |"
  echo "| \`gpuprof insights DB\` max RSS | **$ins_mib MiB** (target ≤ 1024 MiB) |"
  echo
  echo "| table (with its indexes) | rows | MiB | per GPU-hour |"
  echo "|---|---|---|---|"
  while read -r tbl bytes; do
    [ -z "$tbl" ] && continue
    rows="$(table_rows "$tbl" 2>/dev/null || echo '?')"
    awk -v t="$tbl" -v r="$rows" -v b="$bytes" -v gh="$gpu_hours" \
      'BEGIN {printf "| `%s` | %s | %.1f | %.0f KiB |\n", t, r, b / 1048576, b / gh / 1024}'
  done <<<"$breakdown"
} >"$tmp/figures.md"
echo
cat "$tmp/figures.md"

if [ "${UPDATE_DOCS:-0}" = 1 ]; then
  python3 - "$tmp/figures.md" docs/benchmarks.md <<'EOF'
import sys
figures, doc = open(sys.argv[1]).read(), sys.argv[2]
text = open(doc).read()
begin, end = "<!-- long_run:begin -->", "<!-- long_run:end -->"
a, b = text.index(begin) + len(begin), text.index(end)
open(doc, "w").write(text[:a] + "\n" + figures + text[b:])
print(f"long_run: figures written to {doc}")
EOF
fi
