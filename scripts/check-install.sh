#!/usr/bin/env bash
# Checks that pipesched is consumable as a library, the two ways docs/embedding.md
# describes:
#   1. installed package: build the library (host only), `cmake --install` it to a
#      temporary prefix, check what was installed (config, version file, FindNCCL, the
#      public headers and no internal one, each header compiling on its own), then build
#      examples/embed and examples/planner as separate projects with
#      find_package(pipesched) and run them: the losses must fall, the Chrome trace and
#      the SVG must be written, and the planner's build must not mention CUDA at all;
#   2. source tree: the same build with PIPESCHED_BUILD_EXAMPLES=ON adds both examples
#      with add_subdirectory; run them again.
# Usage: scripts/check-install.sh [build-dir]
#   build-dir: a configured pipesched build to install from (default build/host,
#   configured with the host preset when absent). A CUDA build works too.
# JOBS (default 2) sets the build parallelism.
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD
build=${1:-build/host}
jobs=${JOBS:-2}
tmp=$(mktemp -d "${TMPDIR:-/tmp}/pipesched-check-install.XXXXXX")
trap 'rm -rf "$tmp"' EXIT
prefix=$tmp/prefix

fail() {
  echo "check-install: FAIL: $*" >&2
  exit 1
}

echo "== check-install: library ($build)"
if [ ! -f "$build/CMakeCache.txt" ]; then
  if [ "$build" = build/host ]; then
    cmake --preset host >/dev/null
  else
    cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo \
      -DPIPESCHED_ENABLE_CUDA=OFF >/dev/null
  fi
fi
# The installed program pulls in every library.
cmake --build "$build" -j "$jobs" --target pipesched
cmake --install "$build" --prefix "$prefix" >/dev/null

echo "== check-install: installed files"
cmakedir=$prefix/lib/cmake/pipesched
[ -d "$cmakedir" ] || cmakedir=$prefix/lib64/cmake/pipesched
for f in pipeschedConfig.cmake pipeschedConfigVersion.cmake pipeschedTargets.cmake FindNCCL.cmake; do
  [ -f "$cmakedir/$f" ] || fail "missing $cmakedir/$f"
done
libdir=$(dirname "$(dirname "$cmakedir")")
for m in base trace scheduler runtime model comm stages; do
  [ -f "$libdir/libpipesched_$m.a" ] || [ -f "$libdir/libpipesched_$m.so" ] ||
    fail "missing the library of pipesched::$m in $libdir"
done
inc=$prefix/include/pipesched
for f in pipesched.h version.h scheduler/schedule.h trace/timeline.h runtime/runtime.h \
  stages/stage_work.h stages/executor.h comm/all_reduce.h; do
  [ -f "$inc/$f" ] || fail "missing public header include/pipesched/$f"
done
for internal in base/json_util.h base/hash.h base/bytes.h scheduler/dependency_walk.h scheduler/generators trace/op_style.h \
  runtime/memory_account.h runtime/host runtime/cuda model/host_kernels.h \
  model/math_impl.h model/cuda comm/internal.h comm/cuda; do
  [ ! -e "$inc/$internal" ] || fail "internal header installed: include/pipesched/$internal"
done
# Nothing but pipesched/ at the top of include/: the module directories live under it, so
# that a consumer's own base/ or model/ on its include path cannot hide them.
for other in $(ls "$prefix/include"); do
  [ "$other" = pipesched ] || fail "include/$other installed beside include/pipesched"
done
# Every committed header is either public (installed; the two CUDA ones only by a CUDA
# build) or internal (the list above): a new header must be put on one side.
for h in $(cd pipesched && git ls-files 'base/*.h' 'trace/*.h' 'scheduler/*.h' 'runtime/*.h' \
  'model/*.h' 'comm/*.h' 'stages/*.h'); do
  [ -f "$inc/$h" ] && continue
  case $h in
  base/cuda_check.h | runtime/cuda_runtime.h) continue ;;
  base/cublas_check.h | base/nccl_check.h) continue ;; # internal: used by model/cuda, comm/cuda
  base/json_util.h) continue ;;                          # internal: exposes nlohmann/json
  base/hash.h) continue ;;                               # internal: checkpoint and trainer checksums
  base/bytes.h) continue ;;                              # internal: records between a job's processes
  scheduler/dependency_walk.h | scheduler/generators/* | trace/op_style.h) continue ;;
  runtime/memory_account.h | runtime/host/* | runtime/cuda/*) continue ;;
  model/host_kernels.h | model/math_impl.h | model/cuda/* | comm/internal.h | comm/cuda/*) continue ;;
  esac
  fail "pipesched/$h is neither installed nor internal: add it to PIPESCHED_PUBLIC_HEADERS_<module> in CMakeLists.txt (and pipesched/pipesched.h), or to the internal lists in this script"
done
# The umbrella brings in every installed header but the CUDA-facing two (docs/embedding.md).
for h in $(cd "$inc" && find . -name '*.h' | sed 's|^\./||' | sort); do
  case $h in
  pipesched.h | version.h | base/cuda_check.h | runtime/cuda_runtime.h) continue ;;
  esac
  grep -qF "#include \"pipesched/$h\"" "$inc/pipesched.h" ||
    fail "include/pipesched/$h is installed but pipesched/pipesched.h does not include it: add it there"
done
version=$(sed -n 's/^set(PACKAGE_VERSION "\(.*\)")$/\1/p' "$cmakedir/pipeschedConfigVersion.cmake")
[ -n "$version" ] || fail "no PACKAGE_VERSION in pipeschedConfigVersion.cmake"
grep -q "#define PIPESCHED_VERSION_STRING \"$version\"" "$inc/version.h" ||
  fail "include/pipesched/version.h does not say $version"
out=$("$prefix/bin/pipesched" version)
[ "$out" = "pipesched $version" ] || fail "installed 'pipesched version' printed '$out'"

# Every installed header compiles on its own against the installed tree (and the
# system's Abseil), with only include/ on the path, as a consumer has it: none relies on
# an include it does not make, on an internal header or on a module root
# (`#include "base/..."` instead of "pipesched/base/...").
cuda_inc=
[ -d /usr/local/cuda/include ] && cuda_inc=-I/usr/local/cuda/include
cat >"$tmp/compile-header.sh" <<EOF
#!/bin/sh
printf '#include "pipesched/%s"\n' "\$1" | ${CXX:-c++} -std=c++20 -fsyntax-only -x c++ \
  -I"$prefix/include" $cuda_inc - ||
  { echo "header \$1 does not compile on its own" >&2; exit 255; }
EOF
(cd "$prefix/include/pipesched" && find . -name '*.h' | sed 's|^\./||' | sort) >"$tmp/headers"
nheaders=$(wc -l <"$tmp/headers")
xargs -P "$jobs" -n 1 sh "$tmp/compile-header.sh" <"$tmp/headers" ||
  fail "installed headers are not self-contained"
echo "installed $version: $nheaders public headers, each self-contained"

echo "== check-install: examples/embed against the installed package"
cmake -S examples/embed -B "$tmp/embed" -G Ninja -DCMAKE_BUILD_TYPE=Release \
  -DCMAKE_PREFIX_PATH="$prefix" >/dev/null
cmake --build "$tmp/embed" -j "$jobs"

# Runs an embed_example binary (after the command that starts it, if given; with the
# flags in $embed_flags) and checks its output: 10 losses, each below the last, and a
# Chrome trace with complete ("X") events.
embed_flags=()
check_embed() {
  local exe=$1 trace=$2
  shift 2
  rm -f "$trace"
  local log
  log=$("$@" "$exe" "${embed_flags[@]}" "$trace") || fail "$* $exe failed: $log"
  echo "$log"
  echo "$log" | awk '
    /^step [0-9]+ loss / { n++; if (n > 1 && !($4 < prev)) bad = 1; if (n == 1) first = $4; prev = $4 }
    END { if (n != 10 || bad || !(prev < 0.5 * first)) exit 1 }' ||
    fail "$exe: expected 10 falling losses (last < half the first)"
  [ -s "$trace" ] || fail "$exe wrote no trace $trace"
  grep -q '"traceEvents"' "$trace" && grep -q '"ph": *"X"' "$trace" ||
    fail "$trace is not a Chrome trace with spans"
}
alone_log=$(check_embed "$tmp/embed/embed_example" "$tmp/embed_trace.json") || exit 1
echo "$alone_log"

echo "== check-install: examples/embed as a job of two processes (installed pipesched launch)"
# Each process trains on its own share with the gradients averaged over both (found
# through comm::CreateBootstrapFromEnvironment); process 0's output and trace.
launch_log=$(check_embed "$tmp/embed/embed_example" "$tmp/embed_trace_launch.json" \
  "$prefix/bin/pipesched" launch --processes=2 --) || exit 1
echo "$launch_log"
echo "$launch_log" | grep -qx "process 0 of 2" || fail "the launched embed_example is not process 0 of 2"

echo "== check-install: examples/embed with a stage per process (installed pipesched launch)"
# ExecutorOptions::pipeline: the activations and gradients cross as the bootstrap's
# messages, and the losses are those of one process alone, to the last digit printed.
embed_flags=(--split)
split_log=$(check_embed "$tmp/embed/embed_example" "$tmp/embed_trace_split.json" \
  "$prefix/bin/pipesched" launch --processes=2 --) || exit 1
embed_flags=()
echo "$split_log"
[ "$(echo "$split_log" | grep '^step')" = "$(echo "$alone_log" | grep '^step')" ] ||
  fail "the embed_example split across two processes did not train as one process alone"
# Process 0 writes the trace; the crossing's RECV_F is process 1's (the rows merged).
grep -q 'RECV_F' "$tmp/embed_trace_split.json" ||
  fail "$tmp/embed_trace_split.json has no RECV_F span of process 1's stage (rows not merged)"

echo "== check-install: examples/embed as two pipelines of two processes (installed pipesched launch)"
# comm::SplitJob: each pipeline split across two processes, the pipelines data-parallel
# replicas of each other: process 0 prints the losses of the two-process data-parallel job.
embed_flags=(--split)
grid_log=$(check_embed "$tmp/embed/embed_example" "$tmp/embed_trace_grid.json" \
  "$prefix/bin/pipesched" launch --processes=4 --) || exit 1
embed_flags=()
echo "$grid_log"
[ "$(echo "$grid_log" | grep '^step')" = "$(echo "$launch_log" | grep '^step')" ] ||
  fail "the embed_example as two pipelines of two processes did not train as two data-parallel processes"

echo "== check-install: examples/planner against the installed package (no CUDA)"
cmake -S examples/planner -B "$tmp/planner" -G Ninja -DCMAKE_BUILD_TYPE=Release \
  -DCMAKE_PREFIX_PATH="$prefix" >/dev/null
cmake --build "$tmp/planner" -j "$jobs"
# Not in its configuration (the COMPONENTS keep the package from finding CUDA or NCCL)
# and not on its link line.
if grep -E '^(CMAKE_CUDA|CUDAToolkit|CUDA_|NCCL)' "$tmp/planner/CMakeCache.txt"; then
  fail "the planner's configuration found CUDA (above)"
fi
link=$(ninja -C "$tmp/planner" -t commands planner_example | tail -n 1)
if echo "$link" | grep -qiE 'cuda|nccl|cublas|openblas|pipesched_(runtime|model|comm|stages)'; then
  fail "the planner links more than scheduler + trace: $link"
fi
log=$("$tmp/planner/planner_example" "$tmp/planner.svg") || fail "planner_example failed: $log"
echo "$log"
[ "$(echo "$log" | grep -c 'bubble')" -eq 4 ] || fail "planner_example: expected 4 schedules"
grep -q '<svg' "$tmp/planner.svg" || fail "planner_example wrote no SVG"

echo "== check-install: the examples through add_subdirectory of the source tree"
# The same build tree with PIPESCHED_BUILD_EXAMPLES=ON: examples/embed and
# examples/planner are add_subdirectory()'d and link the build's own pipesched:: targets
# (their find_package is skipped), so nothing of the library is compiled again.
cmake -S . -B "$build" -DPIPESCHED_BUILD_EXAMPLES=ON >/dev/null
cmake --build "$build" -j "$jobs" --target embed_example planner_example
check_embed "$build/examples/embed/embed_example" "$tmp/embed_trace_subdir.json"
"$build/examples/planner/planner_example" "$tmp/planner_subdir.svg" >/dev/null ||
  fail "planner_example (add_subdirectory) failed"
[ -s "$tmp/planner_subdir.svg" ] || fail "planner_example (add_subdirectory) wrote no SVG"

echo "== check-install: passed"
