# FindNCCL: NCCL ships no CMake package. Defines NCCL::nccl and NCCL_FOUND.
# Looks in NCCL_ROOT, the CUDA toolkit, /usr/local/cuda, then NVIDIA's pip wheel
# (nvidia-nccl-cu*, which has only libnccl.so.2) through PIPESCHED_PIP_NVIDIA_DIRS.
find_path(NCCL_INCLUDE_DIR nccl.h
  HINTS ${NCCL_ROOT} ENV NCCL_ROOT ${CUDAToolkit_INCLUDE_DIRS} /usr/local/cuda
        ${PIPESCHED_PIP_NVIDIA_DIRS}
  PATH_SUFFIXES include)
find_library(NCCL_LIBRARY NAMES nccl libnccl.so.2
  HINTS ${NCCL_ROOT} ENV NCCL_ROOT ${CUDAToolkit_LIBRARY_DIR} /usr/local/cuda
        ${PIPESCHED_PIP_NVIDIA_DIRS}
  PATH_SUFFIXES lib lib64)
include(FindPackageHandleStandardArgs)
find_package_handle_standard_args(NCCL REQUIRED_VARS NCCL_LIBRARY NCCL_INCLUDE_DIR)
if(NCCL_FOUND AND NOT TARGET NCCL::nccl)
  add_library(NCCL::nccl UNKNOWN IMPORTED)
  set_target_properties(NCCL::nccl PROPERTIES
    IMPORTED_LOCATION "${NCCL_LIBRARY}"
    INTERFACE_INCLUDE_DIRECTORIES "${NCCL_INCLUDE_DIR}")
endif()
mark_as_advanced(NCCL_INCLUDE_DIR NCCL_LIBRARY)
