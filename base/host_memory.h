// Host facts. Memory, for refusing sizes that do not fit before allocating them: Linux
// overcommits, so an allocation larger than what the machine has left may succeed and
// then get the process killed when its pages are touched. CPUs, for saying when the
// host backend's emulated devices compete for cores.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

#include "absl/status/statusor.h"

namespace pipesched {

// MemAvailable of /proc/meminfo in bytes (what can be allocated without swapping,
// page cache included); nullopt when it cannot be read (not Linux, or no such line).
std::optional<std::int64_t> HostMemoryAvailableBytes();

// The CPUs this process may run on (its affinity mask, which a container or taskset may
// narrow below the machine's count); at least 1.
int HostCpuCount();

// "512 B", "1.5 KiB", "12.25 MiB", "3.00 GiB".
std::string HumanBytes(std::int64_t bytes);

// A byte count as a user writes it: digits with an optional fraction and unit, "80GiB",
// "1.5 GiB", "512MiB", "4096", "16 GB". Units (any case): B, KiB, MiB, GiB, TiB (powers
// of 1024) and KB, MB, GB, TB (powers of 1000). InvalidArgument naming the text and the
// accepted forms for anything else, for a result below 1 byte or above 2^62.
absl::StatusOr<std::int64_t> ParseByteSize(std::string_view text);

}  // namespace pipesched
