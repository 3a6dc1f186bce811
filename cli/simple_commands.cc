// `pipesched schedules` and `pipesched version`.
#include <iomanip>

#include "cli/command.h"
#include "scheduler/registry.h"

#ifndef PIPESCHED_VERSION_STRING
#define PIPESCHED_VERSION_STRING "unknown"
#endif

namespace pipesched::cli {

int RunSchedules(const CommandContext& ctx) {
  std::ostream& out = *ctx.out;
  for (const scheduler::ScheduleInfo& info : scheduler::AllSchedules()) {
    out << std::left << std::setw(18) << info.name << info.summary << "\n"
        << std::setw(18) << ""
        << "constraints: " << info.constraints << "\n";
  }
  return kExitOk;
}

int RunVersion(const CommandContext& ctx) {
  *ctx.out << "pipesched " << PIPESCHED_VERSION_STRING << "\n";
  return kExitOk;
}

}  // namespace pipesched::cli
