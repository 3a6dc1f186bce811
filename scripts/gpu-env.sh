# Sourced by scripts/gpu-check.sh (bash). Makes the libraries the build needs besides
# CUDA findable, and says where they came from:
#   - the system's, when their headers are installed (a Debian machine after deps.sh);
#   - else the bundle that scripts/gpu-bundle.sh put in .gpu-deps/, unpacked (never into
#     /) under $PIPESCHED_DEPS_DIR (default /opt/pipesched-deps), with CMAKE_PREFIX_PATH,
#     CPATH, LIBRARY_PATH and LD_LIBRARY_PATH pointing into it: the GPU machine of this
#     workplace has nvcc, CMake and ninja but no package registry;
#   - else, on Debian with root, scripts/deps.sh (apt, with a time limit).
# PIPESCHED_USE_BUNDLE=1 takes the bundle even when the system has the libraries (to test
# the bundle on a development machine). Returns non-zero, with a one-line reason in
# $gpu_env_error, when none of these works; $gpu_env_source says which one was used.

gpu_env_error=""
gpu_env_source=""

_ps_have_system_deps() {
  local h
  for h in absl/base/config.h gtest/gtest.h gmock/gmock.h benchmark/benchmark.h nlohmann/json.hpp; do
    [ -e "/usr/include/$h" ] || return 1
  done
  [ -e /usr/include/cblas.h ] || [ -e /usr/include/x86_64-linux-gnu/cblas.h ]
}

# Unpacks one .deb into $2 without dpkg's database (and without dpkg, when missing).
_ps_unpack_deb() {
  if command -v dpkg-deb >/dev/null 2>&1; then
    dpkg-deb -x "$1" "$2"
  else
    local member
    member=$(ar t "$1" | grep '^data\.tar') || return 1
    case "$member" in
      *.xz) ar p "$1" "$member" | tar -xJ -C "$2" ;;
      *.zst) ar p "$1" "$member" | zstd -dc | tar -x -C "$2" ;;
      *) ar p "$1" "$member" | tar -xz -C "$2" ;;
    esac
  fi
}

_ps_use_bundle() {
  local dir=${PIPESCHED_DEPS_DIR:-/opt/pipesched-deps} deb
  mkdir -p "$dir" || return 1
  for deb in .gpu-deps/*.deb; do
    _ps_unpack_deb "$deb" "$dir" || { gpu_env_error="cannot unpack $deb into $dir"; return 1; }
  done
  local lib=$dir/usr/lib/x86_64-linux-gnu
  # dpkg -x does not run update-alternatives: OpenBLAS's cblas.h and libopenblas.so
  # stay in their openblas-pthread folders.
  export CMAKE_PREFIX_PATH=$dir/usr${CMAKE_PREFIX_PATH:+:$CMAKE_PREFIX_PATH}
  export CPATH=$dir/usr/include:$dir/usr/include/x86_64-linux-gnu/openblas-pthread${CPATH:+:$CPATH}
  export LIBRARY_PATH=$lib:$lib/openblas-pthread${LIBRARY_PATH:+:$LIBRARY_PATH}
  export LD_LIBRARY_PATH=$lib:$lib/openblas-pthread${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
  # Debian's package configs say cmake_policy(VERSION 2.6...3.21): CMake 4 accepts the
  # range, and with this variable any older form too (earlier CMakes ignore it).
  export CMAKE_POLICY_VERSION_MINIMUM=${CMAKE_POLICY_VERSION_MINIMUM:-3.5}
  gpu_env_source="bundle .gpu-deps/ ($(ls .gpu-deps/*.deb | wc -l) packages) unpacked in $dir"
}

gpu_env() {
  if [ "${PIPESCHED_USE_BUNDLE:-0}" != 1 ] && _ps_have_system_deps; then
    gpu_env_source="system packages"
  elif ls .gpu-deps/*.deb >/dev/null 2>&1; then
    _ps_use_bundle || { [ -n "$gpu_env_error" ] || gpu_env_error="cannot use .gpu-deps/"; return 1; }
  elif command -v apt-get >/dev/null 2>&1 && [ "$(id -u)" -eq 0 ] &&
       timeout -k 5 300 bash scripts/deps.sh; then
    gpu_env_source="apt (scripts/deps.sh)"
  else
    gpu_env_error="Abseil, GoogleTest, Google Benchmark, OpenBLAS or nlohmann-json missing and no .gpu-deps/ bundle: run scripts/gpu-bundle.sh where apt works and send .gpu-deps/ along"
    return 1
  fi
  local tool
  for tool in cmake ctest ninja g++; do
    command -v "$tool" >/dev/null 2>&1 || { gpu_env_error="no $tool on PATH"; return 1; }
  done
  # nvcc: on PATH, or where CMakeLists.txt looks for it.
  if ! command -v nvcc >/dev/null 2>&1 && [ ! -x /usr/local/cuda/bin/nvcc ] && [ -z "${CUDACXX:-}" ]; then
    gpu_env_error="no nvcc on PATH nor in /usr/local/cuda/bin (set CUDACXX)"
    return 1
  fi
  return 0
}
