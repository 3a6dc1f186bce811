#include "base/host_memory.h"

#include <sched.h>

#include <algorithm>
#include <cmath>
#include <fstream>
#include <sstream>
#include <thread>
#include <utility>

#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
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

int HostCpuCount() {
  cpu_set_t set;
  CPU_ZERO(&set);
  if (sched_getaffinity(0, sizeof(set), &set) == 0) return std::max(1, CPU_COUNT(&set));
  return std::max(1, static_cast<int>(std::thread::hardware_concurrency()));
}

std::string HumanBytes(std::int64_t bytes) {
  const double b = static_cast<double>(bytes);
  if (bytes >= (std::int64_t{1} << 30)) return absl::StrFormat("%.2f GiB", b / (1 << 30));
  if (bytes >= (std::int64_t{1} << 20)) return absl::StrFormat("%.2f MiB", b / (1 << 20));
  if (bytes >= (std::int64_t{1} << 10)) return absl::StrFormat("%.1f KiB", b / 1024);
  return absl::StrCat(bytes, " B");
}

absl::StatusOr<std::int64_t> ParseByteSize(std::string_view text) {
  const std::string all(text);
  auto bad = [&](const std::string& why) {
    return absl::InvalidArgumentError(absl::StrCat(
        "'", all, "' is not a size", why,
        ": write a number with an optional unit, e.g. 80GiB, 512MiB, 1.5GiB, 16GB or 4096 "
        "(bytes; units B, KiB, MiB, GiB, TiB, KB, MB, GB, TB)"));
  };
  const std::string rest(absl::StripAsciiWhitespace(all));
  std::size_t n = 0;
  while (n < rest.size() && (absl::ascii_isdigit(rest[n]) || rest[n] == '.')) ++n;
  const std::string number = rest.substr(0, n);
  const std::string unit =
      absl::AsciiStrToLower(std::string(absl::StripAsciiWhitespace(rest.substr(n))));
  double value = 0;
  if (number.empty() || std::count(number.begin(), number.end(), '.') > 1 ||
      number.front() == '.' || number.back() == '.' || !absl::SimpleAtod(number, &value)) {
    return bad("");
  }
  static const std::pair<const char*, double> kUnits[] = {
      {"", 1},         {"b", 1},    {"kib", 0x1p10}, {"mib", 0x1p20}, {"gib", 0x1p30},
      {"tib", 0x1p40}, {"kb", 1e3}, {"mb", 1e6},     {"gb", 1e9},     {"tb", 1e12}};
  for (const auto& [name, scale] : kUnits) {
    if (unit != name) continue;
    const double bytes = std::floor(value * scale);
    if (bytes < 1) return bad(" (less than one byte)");
    if (bytes > 0x1p62) return bad(" (more than 2^62 bytes)");
    return static_cast<std::int64_t>(bytes);
  }
  return bad(absl::StrCat(" (unknown unit '", unit, "')"));
}

}  // namespace pipesched
