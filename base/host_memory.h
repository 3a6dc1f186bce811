// Host memory facts for refusing sizes that do not fit before allocating them: Linux
// overcommits, so an allocation larger than what the machine has left may succeed and
// then get the process killed when its pages are touched.
#pragma once

#include <cstdint>
#include <optional>
#include <string>

namespace pipesched {

// MemAvailable of /proc/meminfo in bytes (what can be allocated without swapping,
// page cache included); nullopt when it cannot be read (not Linux, or no such line).
std::optional<std::int64_t> HostMemoryAvailableBytes();

// "512 B", "1.5 KiB", "12.25 MiB", "3.00 GiB".
std::string HumanBytes(std::int64_t bytes);

}  // namespace pipesched
