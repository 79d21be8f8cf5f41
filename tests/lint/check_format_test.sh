#!/usr/bin/env bash
# scripts/check_format.sh's own test (ctest lint.format_selftest): in a small
# made-up repository, a file committed before .clang-format is left alone, the
# same file touched afterwards and unformatted fails (named, with the command
# to fix it), --fix formats it, and a shallow clone checks what HEAD changes.
# usage: check_format_test.sh <scripts/check_format.sh>
set -euo pipefail
check=$(realpath "$1")
cf=${CLANG_FORMAT:-/usr/bin/clang-format}
command -v "$cf" >/dev/null 2>&1 || { echo "no $cf: skipped"; exit 77; }
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
export GIT_AUTHOR_NAME=t GIT_AUTHOR_EMAIL=t@t GIT_COMMITTER_NAME=t GIT_COMMITTER_EMAIL=t@t
repo=$tmp/repo
git init -q "$repo"
cd "$repo"
ugly='int  f( int x ){return x+1;}'
echo "$ugly" > old.cpp
git add old.cpp && git commit -qm old
printf 'BasedOnStyle: Google\nColumnLimit: 110\n' > .clang-format
git add .clang-format && git commit -qm format
fail() { echo "FAILED: $*"; exit 1; }
out=$(bash "$check" --root "$repo") || fail "untouched old file refused: $out"
echo "$ugly" > new.cpp
git add new.cpp && git commit -qm new
if out=$(bash "$check" --root "$repo"); then fail "unformatted new.cpp passed: $out"; fi
grep -q "new.cpp is not formatted" <<<"$out" || fail "new.cpp not named: $out"
grep -q -- "-i new.cpp" <<<"$out" || fail "no command to fix it: $out"
grep -q "old.cpp" <<<"$out" && fail "old.cpp (untouched) named: $out"
echo 'int g();' >> old.cpp  # uncommitted: now touched
if out=$(bash "$check" --root "$repo"); then fail "touched old.cpp passed: $out"; fi
grep -q "old.cpp is not formatted" <<<"$out" || fail "uncommitted change to old.cpp not checked: $out"
bash "$check" --root "$repo" --fix >/dev/null
git commit -qam fixed
out=$(bash "$check" --root "$repo") || fail "after --fix: $out"
# A shallow clone: the commit that added .clang-format is out of reach; HEAD's
# own files are checked.
echo "$ugly" > head.cpp
git add head.cpp && git commit -qm head
git clone -q --depth 1 "file://$repo" "$tmp/shallow"
if out=$(bash "$check" --root "$tmp/shallow"); then fail "shallow: unformatted head.cpp passed: $out"; fi
grep -q "head.cpp is not formatted" <<<"$out" || fail "shallow: head.cpp not named: $out"
grep -q "changed by HEAD" <<<"$out" || fail "shallow: no fallback to HEAD's changes: $out"
grep -q "old.cpp\|new.cpp" <<<"$out" && fail "shallow: files HEAD did not change named: $out"
echo "check_format_test: passed"
