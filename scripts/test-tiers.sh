#!/usr/bin/env bash
# Runs each test tier (a make target) in turn, timing it, and prints one table at the end:
# tier, seconds, how busy the machine's CPUs were meanwhile, result. Every tier runs even when an earlier one failed, so one red tier
# does not hide the state of the others; the exit status is non-zero if any tier failed.
set -uo pipefail

make_cmd=${MAKE:-make}

# Busy and total CPU time of the whole machine so far (the first line of /proc/stat, in clock
# ticks): machine-wide rather than this script's children, because the clusters, servers and
# builds a tier starts run as daemons its own accounting would miss. A tier well under 100 %
# waits on sockets, timers and deadlines rather than the CPU.
cpu_ticks() {
  local _cpu user nice system idle iowait irq softirq steal _rest
  read -r _cpu user nice system idle iowait irq softirq steal _rest </proc/stat
  local busy=$(( user + nice + system + irq + softirq + steal ))
  echo "${busy} $(( busy + idle + iowait ))"
}

rows=()
failed=0
passed_tiers=0
failed_tiers=0
start_all=$(date +%s)
for tier in "$@"; do
  echo "=== tier ${tier} ==="
  start=$(date +%s)
  read -r busy_before total_before < <(cpu_ticks)
  if "${make_cmd}" --no-print-directory "${tier}"; then
    result=passed; passed_tiers=$((passed_tiers + 1))
  else
    result=FAILED; failed=1; failed_tiers=$((failed_tiers + 1))
  fi
  read -r busy_after total_after < <(cpu_ticks)
  busy_pct=$(( 100 * (busy_after - busy_before) / (total_after - total_before > 0 ? total_after - total_before : 1) ))
  rows+=("$(printf '%-14s %7d  %7d%%  %s' "${tier}" "$(( $(date +%s) - start ))" "${busy_pct}" "${result}")")
done

echo
echo "tier           seconds  cpu busy  result"
printf '%s\n' "${rows[@]}"
printf '%-14s %7d\n' total "$(( $(date +%s) - start_all ))"
echo "tiers: ${passed_tiers} passed, ${failed_tiers} failed"
exit "${failed}"
