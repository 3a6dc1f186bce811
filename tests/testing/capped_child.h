// Runs a piece of a test in a forked child process whose address space (RLIMIT_AS) is
// capped a little above its current size, so that the next large allocation, thread
// stack or mapping fails there as it would under `ulimit -v` -- without touching the test
// process. Not under the sanitizers: their runtimes need more address space than the cap
// leaves.
#pragma once

#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstddef>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <optional>

namespace pipesched::testing {

// Exit codes of the child's own setup, kept out of `body`'s way.
inline constexpr int kCappedChildNoStatm = 3;      // /proc/self/statm unreadable
inline constexpr int kCappedChildNoSetrlimit = 4;  // setrlimit failed

// Forks; the child caps its address space at its current size plus `headroom` bytes and
// exits with body()'s value. Returns the child's exit code, or nullopt when it did not
// exit (a signal: an uncaught exception aborts it). The parent should have no other
// thread that the child's `body` relies on.
inline std::optional<int> RunWithCappedAddressSpace(std::size_t headroom,
                                                    const std::function<int()>& body) {
  const pid_t child = ::fork();
  if (child < 0) return std::nullopt;
  if (child == 0) {
    long pages = 0;
    if (FILE* f = std::fopen("/proc/self/statm", "r")) {
      if (std::fscanf(f, "%ld", &pages) != 1) pages = 0;
      std::fclose(f);
    }
    if (pages == 0) std::_Exit(kCappedChildNoStatm);
    const rlim_t cap = static_cast<rlim_t>(pages) * ::sysconf(_SC_PAGESIZE) + headroom;
    const struct rlimit limit = {cap, cap};
    if (::setrlimit(RLIMIT_AS, &limit) != 0) std::_Exit(kCappedChildNoSetrlimit);
    std::_Exit(body());
  }
  int status = 0;
  if (::waitpid(child, &status, 0) != child || !WIFEXITED(status)) return std::nullopt;
  return WEXITSTATUS(status);
}

}  // namespace pipesched::testing
