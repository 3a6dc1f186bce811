// Cost models shared by the scheduler tests.
#pragma once

#include <cstdint>
#include <random>

#include "pipesched/scheduler/cost_model.h"

namespace pipesched::scheduler::testing {

// Four uneven stages with transfers of 0.1, docs/schedules.md's refinement example: the
// searched zb-1p order takes 48.9 at M=12, refined 48.2.
inline CostModel UnevenFourStages() {
  CostModel costs;
  costs.stages = {{.f = 1.2, .b = 2.3, .i = 1.4, .w = 0.9},
                  {.f = 0.8, .b = 2.0, .i = 1.1, .w = 0.9},
                  {.f = 1.5, .b = 2.2, .i = 1.5, .w = 0.7},
                  {.f = 1.0, .b = 1.8, .i = 1.0, .w = 0.8}};
  costs.comm_uniform = 0.1;
  return costs;
}

// `stages` stages with F, I, W drawn from [0.2, 2), B = I + W; with `phases`, each stage
// zeroes its gradients and steps its optimizer for a time in [0.4, 4) half the time; with
// `max_mib` > 0, each stashes 1 to `max_mib` MiB of activations per micro-batch.
inline CostModel RandomStages(std::mt19937& rng, int stages, bool phases, int max_mib = 0) {
  std::uniform_real_distribution<double> time(0.2, 2.0);
  CostModel costs;
  for (int s = 0; s < stages; ++s) {
    StageCosts& c = costs.stages.emplace_back();
    c.f = time(rng);
    c.i = time(rng);
    c.w = time(rng);
    c.b = c.i + c.w;
    if (phases) {
      c.zero_grad = rng() % 2 ? 2 * time(rng) : 0;
      c.optimizer = rng() % 2 ? 2 * time(rng) : 0;
    }
    if (max_mib > 0) {
      c.activation_bytes =
          (1 + static_cast<std::int64_t>(rng() % max_mib)) * (std::int64_t{1} << 20);
    }
  }
  return costs;
}

}  // namespace pipesched::scheduler::testing
