#!/usr/bin/env bash
# The GPU machine's check, in one go: configure and build the `gpu` preset (CUDA, sm_90),
# run the tests labelled `gpu`, run every *_bench program's Cuda benchmarks, and end with
# a short table (also written to <out>/summary.txt). Fails when any step fails, when no
# GPU test passed (a GPU machine whose tests all skip is broken, not green), or when the
# CUDA backend is not configured. Budget: under 8 minutes on one H200 with 16 cores.
#
# Usage: scripts/gpu-check.sh [out-dir]        (default build/gpu/check)
# Benchmarks take part when their name contains "Cuda" (e.g. BM_CudaEnqueue) and time
# the GPU with events (UseManualTime).
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1
out=${1:-build/gpu/check}
mkdir -p "$out"
jobs=$(nproc)
t0=$(date +%s)
rows=()      # "step|seconds|result"
bench_rows=()
status=0

row() { rows+=("$1|$2|$3"); }
fail() { status=1; row "$1" "$2" "FAILED: $3"; }

summary() {
  {
    echo
    echo "== pipesched gpu-check $(date -u +%Y-%m-%dT%H:%MZ) =="
    echo "gpu: ${gpu:-unknown}"
    printf '%-12s %8s  %s\n' step seconds result
    for r in "${rows[@]}"; do
      IFS='|' read -r step secs result <<<"$r"
      printf '%-12s %8s  %s\n' "$step" "$secs" "$result"
    done
    if [ ${#bench_rows[@]} -gt 0 ]; then
      echo "-- Cuda benchmarks (per iteration; per_op = per operation) --"
      printf '%s\n' "${bench_rows[@]}"
    fi
    echo "total: $(($(date +%s) - t0)) s, $([ "$status" -eq 0 ] && echo OK || echo FAILED)"
  } | tee "$out/summary.txt"
}
trap summary EXIT

# Runs "$@" under a time limit, logging to $out/<step>.log; records a row.
step() {
  local name=$1 limit=$2
  shift 2
  local s
  s=$(date +%s)
  timeout "$limit" "$@" >"$out/$name.log" 2>&1
  local rc=$?
  local secs
  secs=$(($(date +%s) - s))
  if [ $rc -eq 124 ]; then
    fail "$name" "$secs" "timed out after ${limit}s (see $out/$name.log)"
  elif [ $rc -ne 0 ]; then
    fail "$name" "$secs" "exit $rc (see $out/$name.log)"; tail -n 30 "$out/$name.log"
  else
    row "$name" "$secs" ok
  fi
  return $rc
}

gpu=$(nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>/dev/null |
      paste -sd ';' -)
bash scripts/deps.sh || { fail deps 0 "missing packages"; exit 1; }

step configure 120 cmake --preset gpu || exit 1
if ! grep -q "pipesched: CUDA backend ON" "$out/configure.log"; then
  fail configure 0 "CUDA backend OFF (no nvcc or no NCCL?)"
  exit 1
fi
step build 330 cmake --build --preset gpu -j "$jobs" || exit 1

# One test at a time: timing tests (stream overlap) must have the GPU to themselves.
s=$(date +%s)
timeout 150 ctest --preset gpu -j 1 --timeout 60 >"$out/ctest.log" 2>&1
rc=$?
passed=$(grep -cE '^ *[0-9]+/[0-9]+ Test +#[0-9]+: .* Passed' "$out/ctest.log")
skipped=$(grep -cE '\*\*\*Skipped|Not Run' "$out/ctest.log")
failed=$(grep -cE '\*\*\*(Failed|Exception|Timeout)' "$out/ctest.log")
result="$passed passed, $skipped skipped, $failed failed"
if [ $rc -ne 0 ]; then
  fail "gpu tests" $(($(date +%s) - s)) "$result (exit $rc, see $out/ctest.log)"
  grep -E '\*\*\*(Failed|Exception|Timeout)' "$out/ctest.log" | head -20
elif [ "$passed" -eq 0 ]; then
  fail "gpu tests" $(($(date +%s) - s)) "$result: nothing passed; is the GPU usable?"
  # ctest hides a skipped test's output; the runtime's GPU test says why it skipped.
  build/gpu/tests/runtime/runtime_gpu_test --gtest_filter='*DescribesItsDevices' 2>&1 |
    grep -m1 -A1 'Skipped'
else
  row "gpu tests" $(($(date +%s) - s)) "$result"
fi

s=$(date +%s)
benches=$(find build/gpu/benchmarks -name '*_bench' -type f -perm -u+x 2>/dev/null | sort)
bench_errors=0
for b in $benches; do
  name=$(basename "$b")
  timeout 60 "$b" --benchmark_filter=Cuda --benchmark_min_time=0.1 \
    --benchmark_out="$out/$name.json" --benchmark_out_format=json >"$out/$name.log" 2>&1
  rc=$?
  [ $rc -ne 0 ] && bench_errors=$((bench_errors + 1))
  grep -q 'ERROR OCCURRED' "$out/$name.log" && bench_errors=$((bench_errors + 1))
  while IFS= read -r line; do bench_rows+=("$name  $line"); done \
    < <(grep -E '^BM_' "$out/$name.log" | tr -s ' ')
done
nbench=$(echo "$benches" | grep -c . || true)
if [ "$bench_errors" -ne 0 ]; then
  fail benchmarks $(($(date +%s) - s)) "$nbench programs, $bench_errors with errors"
else
  row benchmarks $(($(date +%s) - s)) "$nbench programs, ${#bench_rows[@]} Cuda benchmarks"
fi
exit $status
