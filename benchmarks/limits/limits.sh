#!/usr/bin/env bash
# Searches the largest P, V or M (the other two fixed) for which the planner -- generate,
# validate, simulate with unit costs -- stays within a peak resident memory budget.
# Builds planner_limits (Release, scheduler only) into build/fuzz/limits.
# Usage: benchmarks/limits/limits.sh [budget-MiB, default 1024]
set -euo pipefail
cd "$(dirname "$0")/../.."
budget=${1:-1024}
build=build/fuzz/limits
cmake -S benchmarks/limits -B "$build" -G Ninja >/dev/null
cmake --build "$build" -j "$(nproc)" >/dev/null
bin=$build/planner_limits

# fits SCHEDULE P V M: true when the plan succeeds within the budget; its line goes to
# $last, or the reason it does not fit to $why.
fits() {
  local line
  if ! line=$("$bin" "$@" 2>&1); then
    why=$line
    return 1
  fi
  local rss=${line##*peak_rss_mib=}
  if awk -v r="$rss" -v b="$budget" 'BEGIN { exit !(r <= b) }'; then
    last=$line
    return 0
  fi
  why="$* needs ${rss} MiB"
  return 1
}

# search SCHEDULE AXIS P V M STEP: the largest multiple of STEP on AXIS (p, v or m) that fits;
# the value given for AXIS is ignored. Doubles, then bisects.
search() {
  local sched=$1 axis=$2 p=$3 v=$4 m=$5 step=$6
  args() {
    case $axis in
      p) echo "$sched $(($1 * step)) $v $m" ;;
      v) echo "$sched $p $(($1 * step)) $m" ;;
      m) echo "$sched $p $v $(($1 * step))" ;;
    esac
  }
  local lo=1 hi=2 best=""
  fits $(args 1) || { echo "$sched: even $(args 1) does not fit"; return; }
  best=$last
  while fits $(args $hi); do best=$last; lo=$hi; hi=$((hi * 2)); done
  while [ $((hi - lo)) -gt 1 ]; do
    local mid=$(((lo + hi) / 2))
    if fits $(args $mid); then best=$last; lo=$mid; else hi=$mid; fi
  done
  echo "largest ${axis^^} (step $step): $best"
  echo "  next step up: $why"
}

echo "== budget ${budget} MiB peak RSS; unit costs; $(nproc) CPUs"
search 1f1b m 8 1 0 1
search 1f1b m 64 1 0 1
search 1f1b p 0 1 1024 1
search interleaved-1f1b m 8 2 0 8
search interleaved-1f1b v 8 0 1024 2
search interleaved-1f1b p 0 2 1024 1
