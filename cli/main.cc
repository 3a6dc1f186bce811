// The pipesched program. All logic lives in the cli library; see command.h.
#include <sys/auxv.h>
#include <unistd.h>

#include <cstdlib>
#include <exception>
#include <iostream>
#include <new>
#include <optional>
#include <string>
#include <string_view>

#include "cli/command.h"

namespace {

// OpenBLAS starts a thread pool of its own when the library loads, before main (one
// thread per CPU but the caller's), unless OPENBLAS_NUM_THREADS is 1. pipesched never
// uses it: each stream multiplies single-threaded (model/host_kernels.cc). Each of those
// threads maps a 128 MiB work buffer as it starts, retries forever where that fails, and
// the library's exit handler joins them: under an address-space limit (ulimit -v) that the
// process's own data had taken first, pipesched printed its one-line error and then never
// exited (3 runs in 18 at ulimit -v 620000 with a 160 MB --data file). The variable is
// read only as the library loads (a setenv from .preinit_array is too early: libc sets its
// environment up afterwards), so the program starts again, once, with it set: the same
// arguments, descriptors and process, through its own path (so that ps, pgrep and core
// files still say pipesched), about 6 ms. Not when it was started through the dynamic
// loader (ld.so PROGRAM: /proc/self/exe is the loader) or under valgrind (which cannot
// follow it); where the exec fails the run goes on as before.
// The value OPENBLAS_NUM_THREADS had before (`launch` passes that one on,
// cli::OwnEnvironmentChanges) travels to the second start in kBefore: "u" when it was
// unset, else "s" and the value.
void StartWithoutOpenBlasThreadPool(char** argv) {
  constexpr const char* kMarker = "PIPESCHED_STARTED_AGAIN";
  constexpr const char* kBefore = "PIPESCHED_OPENBLAS_NUM_THREADS_BEFORE";
  if (std::getenv(kMarker) != nullptr) {  // the second start: never a third
    if (const char* before = std::getenv(kBefore); before != nullptr) {
      const std::string_view b(before);
      pipesched::cli::RecordOwnEnvironmentChange(
          "OPENBLAS_NUM_THREADS",
          b.empty() || b[0] != 's' ? std::nullopt : std::optional<std::string>(b.substr(1)));
    }
    ::unsetenv(kMarker);
    ::unsetenv(kBefore);
    return;
  }
  const char* threads = std::getenv("OPENBLAS_NUM_THREADS");
  if (threads != nullptr && std::string_view(threads) == "1") return;
  const std::optional<std::string> before =
      threads == nullptr ? std::nullopt : std::optional<std::string>(threads);
  if (::getauxval(AT_BASE) == 0) return;  // run by ld.so, or statically linked
  if (const char* preload = std::getenv("LD_PRELOAD");
      preload != nullptr && std::string_view(preload).find("vgpreload") != std::string_view::npos) {
    return;  // valgrind: set OPENBLAS_NUM_THREADS=1 yourself
  }
  if (::setenv(kBefore, before.has_value() ? ("s" + *before).c_str() : "u", 1) != 0 ||
      ::setenv("OPENBLAS_NUM_THREADS", "1", /*overwrite=*/1) != 0 ||
      ::setenv(kMarker, "1", /*overwrite=*/1) != 0) {
    ::unsetenv(kBefore);
    return;
  }
  char path[4096];
  const ssize_t n = ::readlink("/proc/self/exe", path, sizeof(path) - 1);
  if (n > 0) {
    path[n] = '\0';
    ::execv(path, argv);  // fails for a binary deleted or replaced meanwhile
  }
  ::execv("/proc/self/exe", argv);
  ::unsetenv(kMarker);  // no exec: this run goes on, with the variable set
  ::unsetenv(kBefore);
  pipesched::cli::RecordOwnEnvironmentChange("OPENBLAS_NUM_THREADS", before);
}

}  // namespace

int main(int argc, char** argv) {
  StartWithoutOpenBlasThreadPool(argv);
  // A pipeline puts four streams per (replica, rank) on a GPU, 16 to 32 of them when
  // several ranks share one; CUDA maps streams onto CUDA_DEVICE_MAX_CONNECTIONS hardware
  // queues (8 by default), and streams sharing a queue can hold each other up behind a
  // wait. Read when the CUDA context is created, so set before any CUDA call; a value
  // the user set is kept.
  if (std::getenv("CUDA_DEVICE_MAX_CONNECTIONS") == nullptr) {
    ::setenv("CUDA_DEVICE_MAX_CONNECTIONS", "32", /*overwrite=*/1);
    pipesched::cli::RecordOwnEnvironmentChange("CUDA_DEVICE_MAX_CONNECTIONS", std::nullopt);
  }
  // Sizes are checked before they are allocated (flag ranges, the Trainer's memory check,
  // the runtime's allocators); should a host-side container still not get its memory,
  // say so in one line instead of aborting.
  try {
    const int code =
        pipesched::cli::RunMain(argc, argv, std::cout, std::cerr, ::isatty(STDOUT_FILENO) != 0);
    // Output that never arrived (a full disk, a closed pipe or descriptor) is a failure,
    // not a success with nothing to show.
    std::cout.flush();
    // (Not after `launch` ended by a signal, 128 + its number: it said so already, for
    // a closed output too, 141 as a program killed by SIGPIPE; a signal that stopped it
    // also cuts short a write it was blocked in.)
    if (!std::cout && code <= 128) {
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
