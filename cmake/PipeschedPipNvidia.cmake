# pipesched_pip_nvidia_dirs(<out-var>): the package folders of NVIDIA's pip wheels
# (nvidia-nccl-cu13, nvidia-cublas, ...: <site-packages>/nvidia/<name>, each with include/
# and lib/) of the first python3 on PATH, or an empty list. Images built around PyTorch
# carry NCCL and cuBLAS there, sometimes only there, and their libraries only under
# their versioned names (libnccl.so.2, libcublas.so.13).
function(pipesched_pip_nvidia_dirs out)
  set(dirs "")
  find_program(PIPESCHED_PYTHON3 NAMES python3)
  mark_as_advanced(PIPESCHED_PYTHON3)
  if(PIPESCHED_PYTHON3)
    execute_process(
      COMMAND ${PIPESCHED_PYTHON3} -c
        "import os, nvidia; print(';'.join(os.path.join(p, d) for p in nvidia.__path__ for d in sorted(os.listdir(p))))"
      OUTPUT_VARIABLE found OUTPUT_STRIP_TRAILING_WHITESPACE ERROR_QUIET RESULT_VARIABLE rc
      TIMEOUT 30)
    if(rc EQUAL 0 AND found)
      set(dirs ${found})
    endif()
  endif()
  set(${out} ${dirs} PARENT_SCOPE)
endfunction()
