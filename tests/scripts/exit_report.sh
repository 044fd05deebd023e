#!/usr/bin/env bash
# scripts/lib/common.sh's exit report, as scripts/test uses it: a run that finishes says "passed", one
# that fails or is interrupted by a signal says FAILED and exits non-zero.
set -uo pipefail
cd "$(dirname "$0")/../.."
failures=0

# Runs a script that reports on exit and does $1; checks its exit status ($2: "zero" or "nonzero")
# and that its last line matches $3.
check() {
  local body=$1 want=$2 pattern=$3 out rc
  # A background job starts with SIGINT ignored, which bash cannot trap: --default-signal undoes that,
  # as a terminal's Ctrl-C finds the script.
  out=$(env --default-signal=INT bash -c "set -euo pipefail; source scripts/lib/common.sh; dl_report_on_exit; $body" 2>&1 &
        pid=$!; sleep 0.3; [[ $body == *sleep* ]] && kill -"${SIGNAL:-TERM}" $pid; wait $pid)
  rc=$?
  if [[ $want == zero && $rc -ne 0 ]] || [[ $want == nonzero && $rc -eq 0 ]] || ! grep -Eq "$pattern" <<<"$out"; then
    echo "FAIL: '$body' (signal ${SIGNAL:-none}): exit $rc, output: $out"
    failures=$((failures + 1))
  fi
}

check "true" zero "passed after"
check "false" nonzero "FAILED \(exit 1\)"
SIGNAL=TERM check "true; sleep 5" nonzero "FAILED: interrupted by SIGTERM \(exit 143\)"
SIGNAL=INT check "true; sleep 5" nonzero "FAILED: interrupted by SIGINT \(exit 130\)"
SIGNAL=HUP check "true; sleep 5" nonzero "FAILED: interrupted by SIGHUP \(exit 129\)"

echo "exit_report: $((5 - failures)) passed, $failures failed"
((failures == 0))
