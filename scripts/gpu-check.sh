#!/usr/bin/env bash
# The GPU machine's check, in one go: configure and build the `gpu` preset (CUDA, sm_90),
# run the tests labelled `gpu`, run every *_bench program's Cuda benchmarks, and end with
# a short table. Fails when any step fails, when no GPU test passed (a GPU machine whose
# tests all skip is broken, not green), or when the CUDA backend is not configured.
# Budget: under 8 minutes on one H200 with 16 cores; every step is clamped to what is
# left of GPU_CHECK_BUDGET_S (default 470), so the table is printed even when a step
# hangs, instead of the whole command being killed.
#
# Usage: scripts/gpu-check.sh [out-dir]
#   Logs go to build/gpu/check/. With out-dir (the device tool's $OUT), the table
#   (summary.txt) and every log in one archive (gpu-check-logs.tgz) are copied there at
#   the end: two files, whatever the number of logs.
# A machine without Abseil, GoogleTest, Google Benchmark, OpenBLAS and nlohmann-json and
# without a package registry (this workplace's device machine) builds with the Debian
# packages that scripts/gpu-bundle.sh downloads into .gpu-deps/ (send that folder along:
# carry [".gpu-deps"]); see scripts/gpu-env.sh.
# Benchmarks take part when their name contains "Cuda" (e.g. BM_CudaEnqueue) and time
# the GPU with events (UseManualTime).
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1
copy_to=${1:-}
out=build/gpu/check
mkdir -p "$out"
jobs=$(nproc)
t0=$(date +%s)
deadline=$((t0 + ${GPU_CHECK_BUDGET_S:-470}))
rows=()      # "step|seconds|result"
bench_rows=()
status=0

row() { rows+=("$1|$2|$3"); }
fail() { status=1; row "$1" "$2" "FAILED: $3"; }
# The smaller of $1 seconds and what is left of the budget (at least 5).
left() {
  local l=$((deadline - $(date +%s)))
  [ "$l" -lt 5 ] && l=5
  [ "$1" -lt "$l" ] && echo "$1" || echo "$l"
}

summary() {
  {
    echo
    echo "== pipesched gpu-check $(date -u +%Y-%m-%dT%H:%MZ) $(git rev-parse --short HEAD 2>/dev/null) =="
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
  if [ -n "$copy_to" ]; then
    mkdir -p "$copy_to"
    cp "$out/summary.txt" "$copy_to/summary.txt"
    tar czf "$copy_to/gpu-check-logs.tgz" -C "$out" --exclude='*.tgz' . 2>/dev/null
  fi
}
trap summary EXIT

# Runs "$@" under a time limit (clamped to the budget), logging to $out/<step>.log;
# records a row.
step() {
  local name=$1 limit
  limit=$(left "$2")
  shift 2
  local s
  s=$(date +%s)
  timeout -k 5 "$limit" "$@" >"$out/$name.log" 2>&1
  local rc=$?
  local secs
  secs=$(($(date +%s) - s))
  if [ $rc -eq 124 ] || [ $rc -eq 137 ]; then
    fail "$name" "$secs" "timed out after ${limit}s (see $out/$name.log)"; tail -n 30 "$out/$name.log"
  elif [ $rc -ne 0 ]; then
    fail "$name" "$secs" "exit $rc (see $out/$name.log)"; tail -n 30 "$out/$name.log"
  else
    row "$name" "$secs" ok
  fi
  return $rc
}

gpu=$(timeout -k 5 20 nvidia-smi --query-gpu=name,driver_version,memory.total \
      --format=csv,noheader 2>/dev/null | paste -sd ';' -)

# What the machine has, for the logs (a failed configure is read from here).
{
  echo "== tools"; for t in cmake ninja g++ nvcc python3; do echo "$t: $(command -v $t)"; done
  cmake --version | head -1; g++ --version | head -1
  (command -v nvcc >/dev/null && nvcc --version || /usr/local/cuda/bin/nvcc --version) | tail -2
  echo "== os"; head -2 /etc/os-release
  echo "== CUDA libraries"; ls /usr/local/cuda/lib64 2>/dev/null | grep -E 'cublas|nccl|cudart' | head
  python3 -c 'import os, nvidia; [print(os.path.join(p, d)) for p in nvidia.__path__ for d in sorted(os.listdir(p))]' 2>&1 | head -30
} >"$out/env.log" 2>&1

s=$(date +%s)
# shellcheck source=scripts/gpu-env.sh
source scripts/gpu-env.sh
if gpu_env; then
  row deps $(($(date +%s) - s)) "$gpu_env_source"
else
  fail deps $(($(date +%s) - s)) "$gpu_env_error"
  exit 1
fi
# As the pipesched program does (cli/main.cc): more hardware queues than the default 8
# for the executor's four streams per (replica, rank).
export CUDA_DEVICE_MAX_CONNECTIONS=${CUDA_DEVICE_MAX_CONNECTIONS:-32}
{ echo "== environment"; env | grep -E '^(CMAKE_PREFIX_PATH|CPATH|LIBRARY_PATH|LD_LIBRARY_PATH|CUDA_DEVICE_MAX_CONNECTIONS)='; } >>"$out/env.log"

# Can this toolkit's runtime use the GPU at all? A driver older than the toolkit (CUDA 13
# needs driver 580 or newer, unless compat libraries are set up) makes every test skip
# with cudaErrorInsufficientDriver: learn that in seconds, not after the build.
s=$(date +%s)
nvcc_bin=${CUDACXX:-$(command -v nvcc || echo /usr/local/cuda/bin/nvcc)}
mkdir -p "$out/probe"
cat >"$out/probe/probe.cu" <<'CU'
#include <cstdio>
#include <cuda_runtime.h>
int main() {
  int runtime = 0, driver = 0, n = 0;
  cudaRuntimeGetVersion(&runtime);
  cudaDriverGetVersion(&driver);
  const cudaError_t e = cudaGetDeviceCount(&n);
  std::printf("runtime %d, driver supports %d, %d device(s): %s\n", runtime, driver, n,
              cudaGetErrorString(e));
  return e == cudaSuccess && n > 0 ? 0 : 1;
}
CU
if timeout -k 5 "$(left 60)" "$nvcc_bin" -o "$out/probe/probe" "$out/probe/probe.cu" \
  >"$out/probe.log" 2>&1; then
  probe=$(timeout -k 5 "$(left 30)" "$out/probe/probe" 2>&1)
  rc=$?
  echo "$probe" >>"$out/probe.log"
  if [ $rc -ne 0 ]; then
    fail probe $(($(date +%s) - s)) "no usable GPU: $probe"
    exit 1
  fi
  row probe $(($(date +%s) - s)) "$probe"
else
  # Not fatal: the build below finds its own nvcc (CMakeLists.txt) and says more.
  row probe $(($(date +%s) - s)) "could not compile the probe with $nvcc_bin (see $out/probe.log)"
fi

step configure 120 cmake --preset gpu || exit 1
if ! grep -q "pipesched: CUDA backend ON" "$out/configure.log"; then
  fail configure 0 "CUDA backend OFF: $(grep -m1 -A1 'pipesched: nvcc found' "$out/configure.log" | tr -s ' \n' ' ')(see $out/env.log)"
  exit 1
fi
step build 330 cmake --build --preset gpu -j "$jobs" || exit 1

# One test at a time: timing tests (stream overlap) must have the GPU to themselves. Each
# GPU test has a 90 s limit of its own (cmake/PipeschedHelpers.cmake).
s=$(date +%s)
timeout -k 5 "$(left 200)" ctest --preset gpu -j 1 >"$out/ctest.log" 2>&1
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
  timeout -k 5 30 build/gpu/tests/runtime/runtime_gpu_test --gtest_filter='*DescribesItsDevices' 2>&1 |
    grep -m1 -A1 'Skipped'
else
  row "gpu tests" $(($(date +%s) - s)) "$result"
fi

s=$(date +%s)
benches=$(find build/gpu/benchmarks -name '*_bench' -type f -perm -u+x 2>/dev/null | sort)
bench_errors=0
for b in $benches; do
  name=$(basename "$b")
  timeout -k 5 "$(left 60)" "$b" --benchmark_filter=Cuda --benchmark_min_time=0.1 \
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
