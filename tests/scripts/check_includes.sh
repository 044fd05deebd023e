#!/usr/bin/env bash
# scripts/check-includes passes on the repository and fails on a copy with an upward include added
# (core/ naming nn/, and device/ naming prof/).
set -uo pipefail
cd "$(dirname "$0")/../.."
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
failures=0
expect() {  # expect <zero|nonzero> <root> <what>
  scripts/check-includes "$2" >"$work/out" 2>&1
  local rc=$?
  if [[ $1 == zero && $rc -ne 0 ]] || [[ $1 == nonzero && $rc -eq 0 ]]; then
    echo "FAIL: $3 (exit $rc)"; cat "$work/out"; failures=$((failures + 1))
  fi
}
expect zero . "the repository"

mkdir -p "$work/up" && cp -r include "$work/up/"
printf '#include "../nn/loss.hpp"\n' >>"$work/up/include/dl/core/shape.hpp"
expect nonzero "$work/up" "core/shape.hpp including nn/loss.hpp"

mkdir -p "$work/device" && cp -r include "$work/device/"
printf '#include "../../prof/profiler.hpp"\n' >>"$work/device/include/dl/device/cpu/gemm.hpp"
expect nonzero "$work/device" "device/cpu/gemm.hpp including prof/profiler.hpp"

echo "check_includes: $((3 - failures)) passed, $failures failed"
((failures == 0))
