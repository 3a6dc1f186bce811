#include "pipesched/base/host_memory.h"

#include <pthread.h>
#include <sched.h>
#include <sys/resource.h>

#include <algorithm>
#include <cmath>
#include <fstream>
#include <iterator>
#include <limits>
#include <sstream>
#include <string_view>
#include <thread>
#include <utility>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"

namespace pipesched {

namespace {

std::optional<std::string> ReadSmallFile(const std::string& path) {
  std::ifstream in(path);
  if (!in) return std::nullopt;
  return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

// The value of "<key> <number> [kB]" in a /proc or cgroup key-value file, in bytes
// (`kib`: the number is in kB).
std::optional<std::int64_t> KeyedValue(const std::string& text, std::string_view key, bool kib) {
  std::istringstream lines(text);
  std::string line;
  while (std::getline(lines, line)) {
    if (line.size() <= key.size() || line.compare(0, key.size(), key) != 0) continue;
    std::istringstream fields(line.substr(key.size()));
    std::int64_t value = -1;
    if (!(fields >> value) || value < 0) return std::nullopt;
    if (!kib) return value;
    std::string unit;
    if (!(fields >> unit) || unit != "kB" || value > (std::int64_t{1} << 52)) return std::nullopt;
    return value * 1024;
  }
  return std::nullopt;
}

std::optional<std::int64_t> WholeNumber(const std::optional<std::string>& text) {
  if (!text.has_value()) return std::nullopt;
  std::int64_t value = 0;
  if (!absl::SimpleAtoi(absl::StripAsciiWhitespace(*text), &value) || value < 0) {
    return std::nullopt;
  }
  return value;
}

std::optional<std::int64_t> Limit(int resource) {
  struct rlimit limit {};
  if (::getrlimit(resource, &limit) != 0 || limit.rlim_cur == RLIM_INFINITY ||
      limit.rlim_cur >= (rlim_t{1} << 62)) {
    return std::nullopt;
  }
  return static_cast<std::int64_t>(limit.rlim_cur);
}

// One cgroup directory's headroom: its limit less what it uses that cannot be reclaimed
// (usage without inactive file pages, as container runtimes count a working set).
std::optional<std::int64_t> CgroupDirHeadroom(const std::string& dir, bool v2) {
  std::optional<std::int64_t> limit, usage;
  if (v2) {
    const std::optional<std::string> max = ReadSmallFile(dir + "/memory.max");
    if (!max.has_value() || absl::StripAsciiWhitespace(*max) == "max") return std::nullopt;
    limit = WholeNumber(max);
    usage = WholeNumber(ReadSmallFile(dir + "/memory.current"));
  } else {
    limit = WholeNumber(ReadSmallFile(dir + "/memory.limit_in_bytes"));
    usage = WholeNumber(ReadSmallFile(dir + "/memory.usage_in_bytes"));
  }
  // v1 writes "no limit" as a number near 2^63 (rounded down to a page).
  if (!limit.has_value() || *limit >= (std::int64_t{1} << 62) || !usage.has_value()) {
    return std::nullopt;
  }
  const std::optional<std::string> stat = ReadSmallFile(dir + "/memory.stat");
  const std::int64_t inactive_file =
      stat.has_value()
          ? KeyedValue(*stat, v2 ? "inactive_file " : "total_inactive_file ", false).value_or(0)
          : 0;
  const std::int64_t working_set = std::max<std::int64_t>(0, *usage - inactive_file);
  return std::max<std::int64_t>(0, *limit - working_set);
}

// The least headroom of this process's memory cgroup and its ancestors (a limit set on
// a parent binds its children), for cgroup v2 ("0::/path" in /proc/self/cgroup, mounted
// at /sys/fs/cgroup or /sys/fs/cgroup/unified) and v1 (a "memory" controller line,
// mounted at /sys/fs/cgroup/memory).
std::optional<std::int64_t> CgroupHeadroom() {
  const std::optional<std::string> membership = ReadSmallFile("/proc/self/cgroup");
  if (!membership.has_value()) return std::nullopt;
  std::optional<std::int64_t> least;
  std::istringstream lines(*membership);
  std::string line;
  while (std::getline(lines, line)) {
    // "<id>:<controllers>:<path>"
    const std::size_t first = line.find(':');
    const std::size_t second = first == std::string::npos ? first : line.find(':', first + 1);
    if (second == std::string::npos) continue;
    const std::string controllers = line.substr(first + 1, second - first - 1);
    std::string path = line.substr(second + 1);
    std::vector<std::pair<std::string, bool>> roots;  // mount point, v2
    if (line.compare(0, first, "0") == 0 && controllers.empty()) {
      roots = {{"/sys/fs/cgroup", true}, {"/sys/fs/cgroup/unified", true}};
    } else {
      bool memory = false;
      for (absl::string_view c : absl::StrSplit(controllers, ',')) memory = memory || c == "memory";
      if (!memory) continue;
      roots = {{"/sys/fs/cgroup/memory", false}};
    }
    if (path.empty() || path.front() != '/' || path.find("/..") != std::string::npos) continue;
    for (const auto& [root, v2] : roots) {
      // From the process's group up to the mount's root.
      std::string p = path;
      while (true) {
        if (std::optional<std::int64_t> h = CgroupDirHeadroom(root + (p == "/" ? "" : p), v2)) {
          least = least.has_value() ? std::min(*least, *h) : *h;
        }
        if (p == "/") break;
        const std::size_t slash = p.rfind('/');
        p = slash == 0 ? "/" : p.substr(0, slash);
      }
    }
  }
  return least;
}

}  // namespace

std::optional<MemoryHeadroom> HeadroomOf(const MemoryFacts& facts) {
  if (!facts.mem_available.has_value()) return std::nullopt;
  MemoryHeadroom least{.bytes = std::max<std::int64_t>(0, *facts.mem_available),
                       .bound = MemoryBound::kMachine};
  auto consider = [&](std::optional<std::int64_t> limit, std::optional<std::int64_t> used,
                      MemoryBound bound) {
    if (!limit.has_value() || !used.has_value()) return;  // what is used unknown: no bound
    const std::int64_t left = std::max<std::int64_t>(0, *limit - *used);
    if (left < least.bytes) least = {.bytes = left, .bound = bound};
  };
  consider(facts.address_space_limit, facts.vm_size, MemoryBound::kAddressSpace);
  consider(facts.data_limit, facts.vm_data, MemoryBound::kDataSize);
  consider(facts.cgroup_headroom, std::int64_t{0}, MemoryBound::kCgroup);
  consider(facts.commit_limit, facts.committed, MemoryBound::kCommit);
  return least;
}

std::optional<MemoryHeadroom> MappingHeadroom(const MemoryFacts& facts) {
  MemoryFacts limits_only{.mem_available = std::numeric_limits<std::int64_t>::max(),
                          .address_space_limit = facts.address_space_limit,
                          .vm_size = facts.vm_size,
                          .data_limit = facts.data_limit,
                          .vm_data = facts.vm_data,
                          .commit_limit = facts.commit_limit,
                          .committed = facts.committed};
  const std::optional<MemoryHeadroom> least = HeadroomOf(limits_only);
  if (!least.has_value() || least->bound == MemoryBound::kMachine) return std::nullopt;
  return least;
}

MemoryFacts ReadMemoryFacts() {
  MemoryFacts facts;
  if (std::optional<std::string> meminfo = ReadSmallFile("/proc/meminfo")) {
    facts.mem_available = KeyedValue(*meminfo, "MemAvailable:", true);
    const std::optional<std::string> mode = ReadSmallFile("/proc/sys/vm/overcommit_memory");
    if (mode.has_value() && !mode->empty() && (*mode)[0] == '2') {
      facts.commit_limit = KeyedValue(*meminfo, "CommitLimit:", true);
      facts.committed = KeyedValue(*meminfo, "Committed_AS:", true);
    }
  }
  facts.address_space_limit = Limit(RLIMIT_AS);
  facts.data_limit = Limit(RLIMIT_DATA);
  if (facts.address_space_limit.has_value() || facts.data_limit.has_value()) {
    if (std::optional<std::string> status = ReadSmallFile("/proc/self/status")) {
      facts.vm_size = KeyedValue(*status, "VmSize:", true);
      facts.vm_data = KeyedValue(*status, "VmData:", true);
    }
  }
  facts.cgroup_headroom = CgroupHeadroom();
  return facts;
}

std::optional<MemoryHeadroom> HostMemoryHeadroom() { return HeadroomOf(ReadMemoryFacts()); }

std::optional<std::int64_t> HostMemoryAvailableBytes() {
  const std::optional<MemoryHeadroom> headroom = HostMemoryHeadroom();
  if (!headroom.has_value()) return std::nullopt;
  return headroom->bytes;
}

std::string DescribeHeadroom(const MemoryHeadroom& headroom) {
  const std::string bytes = HumanBytes(headroom.bytes);
  switch (headroom.bound) {
    case MemoryBound::kMachine:
      return absl::StrCat("the machine has ", bytes, " available");
    case MemoryBound::kAddressSpace:
      return absl::StrCat("this process's address-space limit (ulimit -v) leaves ", bytes);
    case MemoryBound::kDataSize:
      return absl::StrCat("this process's data-size limit (ulimit -d) leaves ", bytes);
    case MemoryBound::kCommit:
      return absl::StrCat(
          "the kernel's commit limit (strict overcommit, vm.overcommit_memory=2) leaves ", bytes);
    case MemoryBound::kCgroup:
      return absl::StrCat("the memory cgroup's limit (a container's) leaves ", bytes);
  }
  return bytes;
}

std::int64_t DefaultThreadStackBytes() {
  std::size_t stack = std::size_t{8} << 20;
  pthread_attr_t attr;
  if (::pthread_getattr_default_np(&attr) == 0) {
    ::pthread_attr_getstacksize(&attr, &stack);
    ::pthread_attr_destroy(&attr);
  }
  return static_cast<std::int64_t>(stack);
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
    // A fraction of a byte is refused where it would be the whole fraction ("1.9" or
    // "1.9B" as 1 byte); a larger unit's rounding to whole bytes ("1.1GiB") is kept.
    if (scale == 1 && value != std::floor(value)) return bad(" (a fraction of a byte)");
    const double bytes = std::floor(value * scale);
    if (bytes < 1) return bad(" (less than one byte)");
    if (bytes > 0x1p62) return bad(" (more than 2^62 bytes)");
    return static_cast<std::int64_t>(bytes);
  }
  return bad(absl::StrCat(" (unknown unit '", unit, "')"));
}

}  // namespace pipesched
