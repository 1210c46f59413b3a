#!/usr/bin/env bash
# Runs each test tier (a make target) in turn, timing it, and prints one table at the end:
# tier, seconds, how busy the machine's CPUs were meanwhile, result. Every tier runs even when
# an earlier one failed, so one red tier does not hide the state of the others; the exit
# status is non-zero if any tier failed.
#
# Two more kinds of argument put a build beside the tiers that wait on timers and sockets
# rather than the CPU (on a fresh machine the builds are half of `make test`'s time):
#   bg:TARGET    starts `make TARGET` in the background at the lowest CPU and I/O priority,
#                so it takes only what the tiers running meanwhile leave idle;
#   wait:TARGET  waits for it (before the first tier that needs what it builds); its row
#                gives the seconds it ran in the background and its result, and the wait
#                itself is counted in the total.
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
declare -A bg_pid bg_log bg_start
lowest_priority=(nice -n 19)
command -v ionice >/dev/null && lowest_priority+=(ionice -c 3)

record() {  # tier seconds busy-column result
  local result=$4
  if [[ ${result} == passed ]]; then
    passed_tiers=$((passed_tiers + 1))
  else
    failed=1; failed_tiers=$((failed_tiers + 1))
  fi
  rows+=("$(printf '%-14s %7d  %8s  %s' "$1" "$2" "$3" "${result}")")
}

join_background() {  # target: wait for it, print its output, give it a row
  local target=$1 result=FAILED
  if [[ -z ${bg_pid[${target}]:-} ]]; then
    echo "wait:${target} without bg:${target} before it"
    record "${target}" 0 "bg" "${result}"
    return
  fi
  if wait "${bg_pid[${target}]}"; then result=passed; fi
  cat "${bg_log[${target}]}"; rm -f "${bg_log[${target}]}"
  record "${target}" "$(( $(date +%s) - bg_start[${target}] ))" "bg" "${result}"
  unset "bg_pid[${target}]"
}

start_all=$(date +%s)
for tier in "$@"; do
  case "${tier}" in
    bg:*)
      target=${tier#bg:}
      echo "=== background ${target} (output at its wait) ==="
      bg_log[${target}]=$(mktemp)
      bg_start[${target}]=$(date +%s)
      "${lowest_priority[@]}" "${make_cmd}" --no-print-directory "${target}" \
        >"${bg_log[${target}]}" 2>&1 &
      bg_pid[${target}]=$!
      continue ;;
    wait:*)
      target=${tier#wait:}
      echo "=== waiting for background ${target} ==="
      join_background "${target}"
      continue ;;
  esac
  echo "=== tier ${tier} ==="
  start=$(date +%s)
  read -r busy_before total_before < <(cpu_ticks)
  if "${make_cmd}" --no-print-directory "${tier}"; then result=passed; else result=FAILED; fi
  read -r busy_after total_after < <(cpu_ticks)
  busy_pct=$(( 100 * (busy_after - busy_before) / (total_after - total_before > 0 ? total_after - total_before : 1) ))
  record "${tier}" "$(( $(date +%s) - start ))" "${busy_pct}%" "${result}"
done

for target in "${!bg_pid[@]}"; do  # started and never waited for: not left running
  join_background "${target}"
done

echo
echo "tier           seconds  cpu busy  result"
printf '%s\n' "${rows[@]}"
printf '%-14s %7d\n' total "$(( $(date +%s) - start_all ))"
echo "tiers: ${passed_tiers} passed, ${failed_tiers} failed"
exit "${failed}"
