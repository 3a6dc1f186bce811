// Optimizer choice for a Chunk: SGD (optional momentum, weight decay) or AdamW, both
// with PyTorch's semantics (see SgdParams / AdamWParams in model/math.h).
#pragma once

#include <cstdint>
#include <string_view>

#include "absl/status/statusor.h"
#include "pipesched/model/math.h"

namespace pipesched::model {

enum class OptimizerKind { kSgd, kAdamW };

struct OptimizerConfig {
  OptimizerKind kind = OptimizerKind::kSgd;
  SgdParams sgd;
  AdamWParams adamw;
};

std::string_view OptimizerName(OptimizerKind kind);  // "sgd", "adamw"
// Buffers the size of the parameters that the optimizer keeps: AdamW's two moments, SGD's
// momentum (only when momentum != 0), else none.
int OptimizerStateBuffers(const OptimizerConfig& config);
// Bytes that `num_params` fp32 parameters hold for a whole run: the parameters, their
// gradients and the optimizer's buffers.
std::int64_t StateBytes(std::int64_t num_params, const OptimizerConfig& config);
// "sgd" or "adamw"; InvalidArgument naming the accepted values otherwise.
absl::StatusOr<OptimizerKind> ParseOptimizerKind(std::string_view name);

}  // namespace pipesched::model
