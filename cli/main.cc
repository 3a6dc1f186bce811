// The pipesched program. All logic lives in the cli library; see command.h.
#include <unistd.h>

#include <cstdlib>
#include <exception>
#include <iostream>
#include <new>
#include <string_view>

#include "cli/command.h"

int main(int argc, char** argv) {
  // OpenBLAS starts a thread pool of its own when the library loads, before main (one
  // thread per CPU but the caller's), unless OPENBLAS_NUM_THREADS is 1. pipesched never
  // uses it: each stream multiplies single-threaded (model/host_kernels.cc). Each of those
  // threads maps a 128 MiB work buffer as it starts, retries forever where that fails, and
  // the library's exit handler joins them: under an address-space limit (ulimit -v) that the
  // process's own data had taken first, pipesched printed its one-line error and then never
  // exited (3 runs in 18 at ulimit -v 620000 with a 160 MB --data file). The variable is
  // read only as the library loads, so the program starts again with it set (same
  // arguments, descriptors and process; about 10 ms). Where that cannot be done the run
  // goes on as before.
  if (const char* threads = std::getenv("OPENBLAS_NUM_THREADS");
      threads == nullptr || std::string_view(threads) != "1") {
    ::setenv("OPENBLAS_NUM_THREADS", "1", /*overwrite=*/1);
    ::execv("/proc/self/exe", argv);
  }
  // A pipeline puts four streams per (replica, rank) on a GPU, 16 to 32 of them when
  // several ranks share one; CUDA maps streams onto CUDA_DEVICE_MAX_CONNECTIONS hardware
  // queues (8 by default), and streams sharing a queue can hold each other up behind a
  // wait. Read when the CUDA context is created, so set before any CUDA call; a value
  // the user set is kept.
  ::setenv("CUDA_DEVICE_MAX_CONNECTIONS", "32", /*overwrite=*/0);
  // Sizes are checked before they are allocated (flag ranges, the Trainer's memory check,
  // the runtime's allocators); should a host-side container still not get its memory,
  // say so in one line instead of aborting.
  try {
    const int code =
        pipesched::cli::RunMain(argc, argv, std::cout, std::cerr, ::isatty(STDOUT_FILENO) != 0);
    // Output that never arrived (a full disk, a closed pipe or descriptor) is a failure,
    // not a success with nothing to show.
    std::cout.flush();
    if (!std::cout) {
      std::cerr << "pipesched: cannot write to standard output (disk full, or the pipe or "
                   "file closed); the command's output is lost\n";
      return code == 0 ? 1 : code;
    }
    return code;
  } catch (const std::bad_alloc&) {
    std::cerr << "pipesched: out of host memory; use smaller sizes (--hidden, --layers, "
                 "--microbatch-size, --microbatches) or free memory\n";
    return 1;
  } catch (const std::exception& e) {
    // A bug, not bad input (input is checked where it is read): one line, not an abort.
    std::cerr << "pipesched: internal error: " << e.what() << "; please report it\n";
    return 1;
  }
}
