// `pipesched schedules` and `pipesched version`.
#include <iomanip>

#include "cli/command.h"
#include "pipesched/scheduler/registry.h"
#include "pipesched/version.h"

namespace pipesched::cli {

int RunSchedules(const CommandContext& ctx) {
  if (int code; RejectArguments(ctx, "schedules", code, /*takes_flags=*/false)) return code;
  std::ostream& out = *ctx.out;
  for (const scheduler::ScheduleInfo& info : scheduler::AllSchedules()) {
    out << std::left << std::setw(18) << info.name << info.summary << "\n"
        << std::setw(18) << ""
        << "constraints: " << info.constraints << "\n";
  }
  return kExitOk;
}

int RunVersion(const CommandContext& ctx) {
  if (int code; RejectArguments(ctx, "version", code, /*takes_flags=*/false)) return code;
  *ctx.out << "pipesched " << VersionString() << "\n";  // the library linked
  return kExitOk;
}

}  // namespace pipesched::cli
