#!/usr/bin/env bash
# Static checks, from the repository root:
#   clang-format  every *.h / *.cc / *.c under cpp/ against .clang-format (Debian's clang-format;
#                 `make format` rewrites the tree)
#   ruff          python/ and scripts/ (rules in pyproject.toml [tool.ruff]; .venv's pinned ruff)
#   mypy          --strict on python/gpuprof and python/linescope (pyproject.toml [tool.mypy];
#                 .venv's pinned mypy)
# Every check runs; one summary line each at the end; the exit status is 1 when any failed.
# Usage: scripts/lint.sh   (PY=path/to/python picks another venv's ruff and mypy)
set -uo pipefail
cd "$(dirname "$0")/.."

PY="${PY:-.venv/bin/python}"
RUFF_PATHS=(python scripts)
CLANG_FORMAT="${CLANG_FORMAT:-clang-format}"

summary=()
failed=0

report() {  # report NAME STATUS DETAIL
  summary+=("$(printf '%-13s %-4s %s' "$1" "$2" "$3")")
  [ "$2" = "ok" ] || failed=1
}

# ---- clang-format ----------------------------------------------------------------------------
echo "== clang-format (cpp/)"
if ! command -v "$CLANG_FORMAT" >/dev/null 2>&1; then
  report clang-format FAIL "$CLANG_FORMAT not found (Debian: apt-get install clang-format)"
else
  mapfile -d '' sources < <(find cpp -type f \( -name '*.h' -o -name '*.cc' -o -name '*.c' \) \
                              -print0 | sort -z)
  log="$(mktemp)"
  # --dry-run -Werror: a file that formatting would change is an error (nothing is written).
  printf '%s\0' "${sources[@]}" | xargs -0 -r "$CLANG_FORMAT" --dry-run -Werror 2>"$log"
  status=$?
  # One line per file that needs formatting, not every violation.
  mapfile -t unformatted < <(grep -oE '^[^:]+:[0-9]+:[0-9]+: error: code should be' "$log" \
                               | cut -d: -f1 | sort -u)
  if [ "$status" -eq 0 ]; then
    report clang-format ok "${#sources[@]} files formatted"
  elif [ "${#unformatted[@]}" -gt 0 ]; then
    printf '  needs formatting: %s\n' "${unformatted[@]}"
    report clang-format FAIL \
           "${#unformatted[@]} of ${#sources[@]} files need formatting (make format)"
  else
    cat "$log"
    report clang-format FAIL "clang-format failed (exit $status; see its output above)"
  fi
  rm -f "$log"
fi

# ---- ruff ------------------------------------------------------------------------------------
echo "== ruff check ${RUFF_PATHS[*]}"
if ! "$PY" -m ruff --version >/dev/null 2>&1; then
  report ruff FAIL "ruff is not installed in $PY's environment (scripts/requirements-dev.txt)"
elif "$PY" -m ruff check "${RUFF_PATHS[@]}"; then
  report ruff ok "$("$PY" -m ruff --version) on ${RUFF_PATHS[*]}"
else
  report ruff FAIL "$("$PY" -m ruff --version): errors above"
fi

# ---- mypy ------------------------------------------------------------------------------------
echo "== mypy --strict (python/gpuprof, python/linescope)"
if ! "$PY" -m mypy --version >/dev/null 2>&1; then
  report mypy FAIL "mypy is not installed in $PY's environment (scripts/requirements-dev.txt)"
else
  mypy_out="$("$PY" -m mypy --strict 2>&1)"
  mypy_status=$?
  echo "$mypy_out"
  if [ "$mypy_status" -eq 0 ]; then
    report mypy ok "$("$PY" -m mypy --version | cut -d' ' -f1-2): $(tail -n 1 <<<"$mypy_out")"
  else
    report mypy FAIL "$("$PY" -m mypy --version | cut -d' ' -f1-2): $(tail -n 1 <<<"$mypy_out")"
  fi
fi

echo
echo "== lint summary"
printf '%s\n' "${summary[@]}"
exit "$failed"
