#!/usr/bin/env bash
# expect_failure.sh MAX_SECONDS REGEX COMMAND...
# Passes when COMMAND exits non-zero within MAX_SECONDS and its stderr
# matches the extended regular expression REGEX.
set -u
max=$1; regex=$2; shift 2
err=$(mktemp)
start=$(date +%s)
timeout -k 5 "$max" "$@" 2>"$err" >/dev/null
rc=$?
elapsed=$(( $(date +%s) - start ))
cat "$err" >&2
if [ "$rc" -eq 124 ] || [ "$rc" -eq 137 ]; then
  echo "FAIL: still running after ${max}s (hang)" >&2; rm -f "$err"; exit 1
fi
if [ "$rc" -eq 0 ]; then
  echo "FAIL: exit status 0, expected non-zero" >&2; rm -f "$err"; exit 1
fi
if ! grep -Eq -- "$regex" "$err"; then
  echo "FAIL: stderr does not match: $regex" >&2; rm -f "$err"; exit 1
fi
echo "OK: exit status $rc after ${elapsed}s, diagnostic found" >&2
rm -f "$err"
exit 0
