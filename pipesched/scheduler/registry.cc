// The one table of schedule generators. Adding a schedule: one file in generators/,
// its declaration in generators/generators.h, one line here.
#include "pipesched/scheduler/registry.h"

#include <string>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "pipesched/base/strings.h"
#include "pipesched/scheduler/generators/generators.h"

namespace pipesched::scheduler {

const std::vector<ScheduleInfo>& AllSchedules() {
  static const std::vector<ScheduleInfo>* const kSchedules = new std::vector<ScheduleInfo>{
      {"gpipe", "all forwards, then all backwards (Huang et al. 2019)", "P >= 1, M >= 1, V = 1", 1,
       &GenerateGPipe},
      {"1f1b", "one forward one backward after a warm-up (PipeDream-flush)",
       "P >= 1, M >= 1, V = 1", 1, &GenerateOneFOneB},
      {"interleaved-1f1b", "1F1B over V chunks per rank, loop placement (Megatron-LM)",
       "P >= 1, V >= 2, M >= 1 and a multiple of max(1, M / P)", 2, &GenerateInterleaved1F1B},
      {"interleaved-zb", "interleaved 1F1B with backward split into I and W (zero bubble)",
       "P >= 1, V >= 2, M >= 1 and a multiple of max(1, M / P)", 2, &GenerateInterleavedZb},
      {"looped-bfs", "each chunk's forwards for all micro-batches, then backwards in reverse",
       "P >= 1, M >= 1, V >= 1", 2, &GenerateLoopedBfs},
      {"zb-h1", "1F1B with backward split into I and W, W deferred into the bubbles",
       "P >= 1, M >= 1, V = 1", 1, &GenerateZbH1},
      {"zb-v", "zero-bubble V schedule: two chunks per rank in a V, I and W split",
       "P >= 1, M >= 1, V = 2", 2, &GenerateZbV},
      {"dualpipe-v", "DeepSeek's DualPipe cut in half: zb-v's V, forward-backward pairs",
       "P >= 1, M >= 2P, V = 2", 2, &GenerateDualPipeV},
      {"zb-1p", "zero bubble searched for the costs, at most P live activations (1F1B's peak)",
       "P >= 1, M >= 1, V = 1", 1, &GenerateZb1p, /*uses_costs=*/true},
      {"zb-2p", "zero bubble searched for the costs, at most 2P live activations",
       "P >= 1, M >= 1, V = 1", 1, &GenerateZb2p, /*uses_costs=*/true},
      {"zb-v-1p", "zb-v's placement and memory, the order searched for the costs",
       "P >= 1, M >= 1, V = 2", 2, &GenerateZbV1p, /*uses_costs=*/true},
      {"interleaved-zb-1p",
       "interleaved-zb's placement in 1F1B's memory, any M, searched for the costs",
       "P >= 1, V >= 2, M >= 1", 2, &GenerateInterleavedZb1p, /*uses_costs=*/true},
      {"zb-v-half", "V-Half: zb-v's placement in half of 1F1B's memory, searched for the costs",
       "P >= 1, M >= 1, V = 2", 2, &GenerateZbVHalf, /*uses_costs=*/true},
      {"zb-v-min", "V-Min: zb-v's placement in a third of 1F1B's memory, searched for the costs",
       "P >= 1, M >= 1, V = 2", 2, &GenerateZbVMin, /*uses_costs=*/true},
  };
  return *kSchedules;
}

const ScheduleInfo* FindSchedule(std::string_view name) {
  for (const ScheduleInfo& info : AllSchedules()) {
    if (info.name == name) return &info;
  }
  return nullptr;
}

absl::StatusOr<Schedule> GenerateSchedule(std::string_view name, const GeneratorParams& params) {
  const ScheduleInfo* info = FindSchedule(name);
  if (info == nullptr) {
    std::vector<std::string> names;
    for (const ScheduleInfo& known : AllSchedules()) names.emplace_back(known.name);
    return absl::NotFoundError(absl::StrCat("unknown schedule \"", Absl(name),
                                            "\"; known schedules: ", absl::StrJoin(names, ", ")));
  }
  return info->generate(params);
}

}  // namespace pipesched::scheduler
