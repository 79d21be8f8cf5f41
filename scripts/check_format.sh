#!/usr/bin/env bash
# The formatting ratchet (docs/testing.md, "Formatting"): every C++/CUDA file
# (.h, .cpp, .cu, .cuh) changed in the commits after the one that introduced
# .clang-format must be as clang-format (Debian's /usr/bin/clang-format, 14)
# writes it with the repository's .clang-format. Files nobody touched since
# keep their old layout until a change touches them: touched files converge.
# Where the history does not reach that commit (a shallow clone), the files
# HEAD itself changes are checked instead. Uncommitted changes to tracked
# files are checked too.
#
#   scripts/check_format.sh [--fix] [--root DIR]
#
# Prints each unformatted file and the command that formats it; exit 0: all
# formatted, 1: some are not, 77: no clang-format here (ctest counts it as
# skipped). --fix formats them in place instead. CLANG_FORMAT overrides the
# program.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
fix=0
while [ $# -gt 0 ]; do
  case $1 in
    --fix) fix=1 ;;
    --root) root=$2; shift ;;
    *) echo "usage: scripts/check_format.sh [--fix] [--root DIR]" >&2; exit 2 ;;
  esac
  shift
done
cd "$root"
cf=${CLANG_FORMAT:-/usr/bin/clang-format}
if ! command -v "$cf" >/dev/null 2>&1; then
  echo "check_format: $cf not found (apt-get install clang-format): not checked"
  exit 77
fi
[ -f .clang-format ] || { echo "check_format: no .clang-format in $root" >&2; exit 2; }

# The commit that added .clang-format, unless it is a shallow clone's
# boundary (there every file looks added).
intro=$(git log --diff-filter=A --format=%H -- .clang-format | tail -n 1)
shallow=$(git rev-parse --git-path shallow)
if [ -n "$intro" ] && [ -f "$shallow" ] && grep -qx "$intro" "$shallow"; then intro=""; fi
exts=('*.h' '*.cpp' '*.cu' '*.cuh')
if [ -n "$intro" ]; then
  what="changed since ${intro:0:10} (the commit that added .clang-format)"
  committed=$(git diff --name-only --diff-filter=ACMR "$intro" HEAD -- "${exts[@]}")
else
  what="changed by HEAD (history too shallow to find the commit that added .clang-format)"
  committed=$(git diff-tree --root --no-commit-id --name-only -r --diff-filter=ACMR HEAD -- "${exts[@]}")
fi
uncommitted=$(git diff --name-only --diff-filter=ACMR HEAD -- "${exts[@]}")
mapfile -t files < <(printf '%s\n%s\n' "$committed" "$uncommitted" | sed '/^$/d' | sort -u)

bad=()
for f in "${files[@]}"; do
  [ -f "$f" ] || continue
  if ! "$cf" --style=file --dry-run -Werror "$f" >/dev/null 2>&1; then
    if [ "$fix" = 1 ]; then
      "$cf" --style=file -i "$f"
      echo "check_format: formatted $f"
    else
      n=$(diff <(cat "$f") <("$cf" --style=file "$f") | grep -c '^>' || true)
      echo "check_format: $f is not formatted ($n lines differ)"
      bad+=("$f")
    fi
  fi
done
if [ ${#bad[@]} -gt 0 ]; then
  echo "check_format: ${#bad[@]} of ${#files[@]} C++/CUDA files $what are not formatted; to format them:"
  echo "  $cf --style=file -i ${bad[*]}"
  echo "  (or scripts/check_format.sh --fix; a region clang-format must leave alone: // clang-format off ... on)"
  exit 1
fi
echo "check_format: ${#files[@]} C++/CUDA files $what, all formatted"
