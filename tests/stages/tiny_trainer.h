// The tiny trainer configuration the memory tests share: the built-in MLP split in two
// stages, 8 micro-batches of 32, on the strict host backend with exact memory accounting
// (so that a step's measured peaks are the planned ones).
#pragma once

#include <string>

#include "pipesched/stages/trainer.h"

namespace pipesched::stages::testing {

inline TrainerConfig TinyTrainerConfig(const std::string& schedule) {
  TrainerConfig config;
  config.schedule = schedule;
  config.stages = 2;
  config.microbatches = 8;
  config.microbatch_size = 32;
  config.model = {.d_in = 16, .d_hidden = 64, .num_classes = 4, .num_layers = 4};
  config.backend = "host";
  config.strict = true;
  config.exact_memory_accounting = true;
  return config;
}

}  // namespace pipesched::stages::testing
