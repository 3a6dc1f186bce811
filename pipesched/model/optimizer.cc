#include "pipesched/model/optimizer.h"

#include <string>

#include "absl/strings/str_cat.h"
#include "pipesched/base/strings.h"

namespace pipesched::model {

int OptimizerStateBuffers(const OptimizerConfig& config) {
  if (config.kind == OptimizerKind::kAdamW) return 2;
  return config.sgd.momentum != 0.0f ? 1 : 0;
}

std::int64_t StateBytes(std::int64_t num_params, const OptimizerConfig& config) {
  return num_params * (2 + OptimizerStateBuffers(config)) *
         static_cast<std::int64_t>(sizeof(float));
}

std::string_view OptimizerName(OptimizerKind kind) {
  switch (kind) {
    case OptimizerKind::kSgd:
      return "sgd";
    case OptimizerKind::kAdamW:
      return "adamw";
  }
  return "unknown";
}

absl::StatusOr<OptimizerKind> ParseOptimizerKind(std::string_view name) {
  if (name == "sgd") return OptimizerKind::kSgd;
  if (name == "adamw") return OptimizerKind::kAdamW;
  return absl::InvalidArgumentError(
      absl::StrCat("unknown optimizer '", Absl(name), "'; accepted: sgd, adamw"));
}

}  // namespace pipesched::model
