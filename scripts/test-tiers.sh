#!/usr/bin/env bash
# Runs each test tier (a make target) in turn, timing it, and prints one table at the end:
# tier, seconds, result. Every tier runs even when an earlier one failed, so one red tier
# does not hide the state of the others; the exit status is non-zero if any tier failed.
set -uo pipefail

make_cmd=${MAKE:-make}
rows=()
failed=0
passed_tiers=0
failed_tiers=0
start_all=$(date +%s)
for tier in "$@"; do
  echo "=== tier ${tier} ==="
  start=$(date +%s)
  if "${make_cmd}" --no-print-directory "${tier}"; then
    result=passed; passed_tiers=$((passed_tiers + 1))
  else
    result=FAILED; failed=1; failed_tiers=$((failed_tiers + 1))
  fi
  rows+=("$(printf '%-14s %7d  %s' "${tier}" "$(( $(date +%s) - start ))" "${result}")")
done

echo
echo "tier           seconds  result"
printf '%s\n' "${rows[@]}"
printf '%-14s %7d\n' total "$(( $(date +%s) - start_all ))"
echo "tiers: ${passed_tiers} passed, ${failed_tiers} failed"
exit "${failed}"
