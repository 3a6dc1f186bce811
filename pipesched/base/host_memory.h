// Host facts. Memory, for refusing sizes that do not fit before allocating them: Linux
// overcommits, so an allocation larger than what the machine has left may succeed and
// then get the process killed when its pages are touched. CPUs, for saying when the
// host backend's emulated devices compete for cores.
#pragma once

#include <cstdint>
#include <limits>
#include <optional>
#include <string>
#include <string_view>

#include "absl/status/statusor.h"

namespace pipesched {

// What bounds the memory this process can still allocate.
enum class MemoryBound {
  kMachine,       // MemAvailable of /proc/meminfo
  kAddressSpace,  // RLIMIT_AS (ulimit -v) less the process's VmSize
  kDataSize,      // RLIMIT_DATA (ulimit -d) less its VmData
  kCgroup,        // a memory cgroup's limit (a container's) less what the group cannot reclaim
  kCommit,        // strict overcommit (vm.overcommit_memory=2): CommitLimit less Committed_AS
};

struct MemoryHeadroom {
  std::int64_t bytes = 0;  // >= 0
  MemoryBound bound = MemoryBound::kMachine;
};

// The facts MemoryHeadroom is computed from, in bytes; nullopt where there is no such
// limit (or it cannot be read).
struct MemoryFacts {
  std::optional<std::int64_t> mem_available;
  std::optional<std::int64_t> address_space_limit, vm_size;
  std::optional<std::int64_t> data_limit, vm_data;
  // The tightest memory cgroup on the way from this process's group to the root: its
  // limit less its usage without inactive file pages (they are reclaimed first).
  std::optional<std::int64_t> cgroup_headroom;
  // Under strict overcommit only (vm.overcommit_memory=2), /proc/meminfo's CommitLimit
  // and Committed_AS: every writable private mapping is charged when it is made, touched
  // or not, so the kernel refuses one past the limit.
  std::optional<std::int64_t> commit_limit, committed;
};

// The least of the bounds in `facts` (a limit below what is used leaves 0; a limit whose
// use is unknown bounds nothing); ties go to the machine. nullopt without mem_available.
std::optional<MemoryHeadroom> HeadroomOf(const MemoryFacts& facts);

// The least of the limits on what the process maps (ulimit -v, ulimit -d, and the kernel's
// commit limit under strict overcommit), which bind address space that is mapped but
// never touched, unlike the machine's memory or a cgroup's; nullopt when none is set (or
// what it has used is unknown).
std::optional<MemoryHeadroom> MappingHeadroom(const MemoryFacts& facts);

// This process's MemoryFacts, read now (/proc/meminfo, /proc/sys/vm/overcommit_memory,
// getrlimit, /proc/self/status,
// /proc/self/cgroup with cgroup v2's memory.max/current/stat or v1's
// memory.limit_in_bytes/usage_in_bytes/stat under /sys/fs/cgroup).
MemoryFacts ReadMemoryFacts();

// HeadroomOf(ReadMemoryFacts()): what can be allocated without swapping or being killed
// by a container's limit, and without failing under ulimit -v; nullopt when MemAvailable
// cannot be read (not Linux).
std::optional<MemoryHeadroom> HostMemoryHeadroom();

// HostMemoryHeadroom()'s bytes.
std::optional<std::int64_t> HostMemoryAvailableBytes();

// For messages: "the machine has 20.00 GiB available", "this process's address-space
// limit (ulimit -v) leaves 1.00 GiB", "this process's data-size limit (ulimit -d) leaves
// ...", "the memory cgroup's limit (a container's) leaves ...".
std::string DescribeHeadroom(const MemoryHeadroom& headroom);

// The CPUs this process may run on (its affinity mask, which a container or taskset may
// narrow below the machine's count); at least 1.
int HostCpuCount();

// What each new thread maps for its stack: glibc's default (the soft `ulimit -s`, 8 MiB
// unless changed), or 8 MiB when it cannot be read.
std::int64_t DefaultThreadStackBytes();

// "512 B", "1.5 KiB", "12.25 MiB", "3.00 GiB".
std::string HumanBytes(std::int64_t bytes);

// a + b, or INT64_MAX where that overflows: byte counts added up (peaks of several
// ranks, each possibly near the limit).
inline std::int64_t SaturatingAdd(std::int64_t a, std::int64_t b) {
  std::int64_t sum = 0;
  return __builtin_add_overflow(a, b, &sum) ? std::numeric_limits<std::int64_t>::max() : sum;
}

// A byte count as a user writes it: digits with an optional fraction and unit, "80GiB",
// "1.5 GiB", "512MiB", "4096", "16 GB". Units (any case): B, KiB, MiB, GiB, TiB (powers
// of 1024) and KB, MB, GB, TB (powers of 1000). InvalidArgument naming the text and the
// accepted forms for anything else, for a result below 1 byte or above 2^62.
absl::StatusOr<std::int64_t> ParseByteSize(std::string_view text);

}  // namespace pipesched
