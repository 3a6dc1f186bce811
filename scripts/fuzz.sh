#!/usr/bin/env bash
# Builds the libFuzzer targets (fuzz/, clang, ASan+UBSan) into build/fuzz and runs each
# for a bounded time on a copy of its seed corpus (fuzz/corpus/<target>/), with its
# dictionary. Prints the executions per target; exits non-zero when any target crashes,
# leaks, times out or runs out of memory. The crashing input is kept under
# build/fuzz/artifacts/ (add it to fuzz/corpus/<target>/regression-* once fixed).
# Usage: scripts/fuzz.sh [seconds-per-target, default 60]
set -euo pipefail
cd "$(dirname "$0")/.."
seconds=${1:-60}
bash scripts/deps.sh clang libclang-rt-14-dev

build=build/fuzz
jobs=$(nproc)
CC=clang CXX=clang++ cmake -S fuzz -B "$build" -G Ninja >/dev/null
cmake --build "$build" -j "$jobs"

# target:dictionary
targets=(fuzz_pytorch_csv:actions fuzz_schedule_json:schedule_json fuzz_cost_model:cost_model
         fuzz_safetensors:safetensors)
work="$build/run"
artifacts="$build/artifacts"
rm -rf "$work"
mkdir -p "$work" "$artifacts"
failed=()
summary=()
for entry in "${targets[@]}"; do
  target=${entry%%:*}
  dict=fuzz/${entry##*:}.dict
  corpus="$work/$target"
  cp -r "fuzz/corpus/$target" "$corpus"  # libFuzzer adds to the corpus it is given
  log="$work/$target.log"
  echo "== $target (${seconds}s)"
  rc=0
  "$build/$target" -max_total_time="$seconds" -rss_limit_mb=2048 -timeout=10 \
    -dict="$dict" -print_final_stats=1 -artifact_prefix="$artifacts/$target-" \
    "$corpus" >"$log" 2>&1 || rc=$?
  runs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log" | tail -1)
  cov=$(grep -o 'cov: [0-9]*' "$log" | tail -1 || true)
  summary+=("$(printf '%-20s %12s executions  %s  rc=%d' "$target" "${runs:-?}" "$cov" "$rc")")
  if [ "$rc" -ne 0 ]; then
    failed+=("$target")
    grep -E 'ERROR|SUMMARY|runtime error|PS_FUZZ_CHECK|Test unit written' "$log" | head -20 >&2
  fi
done
echo "== fuzz summary (${seconds}s per target)"
printf '%s\n' "${summary[@]}"
if [ ${#failed[@]} -ne 0 ]; then
  echo "fuzz: crashes in ${failed[*]}; logs in $work, inputs in $artifacts" >&2
  exit 1
fi
echo "fuzz: no crashes"
