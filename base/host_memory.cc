#include "base/host_memory.h"

#include <fstream>
#include <sstream>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace pipesched {

std::optional<std::int64_t> HostMemoryAvailableBytes() {
  std::ifstream meminfo("/proc/meminfo");
  std::string line;
  while (std::getline(meminfo, line)) {
    // "MemAvailable:   20123456 kB"
    if (line.rfind("MemAvailable:", 0) != 0) continue;
    std::istringstream fields(line.substr(13));
    std::int64_t kib = -1;
    std::string unit;
    if (!(fields >> kib >> unit) || kib < 0 || unit != "kB") return std::nullopt;
    return kib * 1024;
  }
  return std::nullopt;
}

std::string HumanBytes(std::int64_t bytes) {
  const double b = static_cast<double>(bytes);
  if (bytes >= (std::int64_t{1} << 30)) return absl::StrFormat("%.2f GiB", b / (1 << 30));
  if (bytes >= (std::int64_t{1} << 20)) return absl::StrFormat("%.2f MiB", b / (1 << 20));
  if (bytes >= (std::int64_t{1} << 10)) return absl::StrFormat("%.1f KiB", b / 1024);
  return absl::StrCat(bytes, " B");
}

}  // namespace pipesched
