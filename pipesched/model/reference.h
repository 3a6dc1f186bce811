// Plain single-device training on the host: the whole model as one Chunk on a host
// device, each step running its micro-batches one after another (F, loss, B) and one
// optimizer update. The executor's correctness contract compares against this: after K
// steps on the same global batches, a pipelined run's parameters equal these.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "pipesched/model/chunk.h"
#include "pipesched/runtime/runtime.h"

namespace pipesched::model {

struct ReferenceOptions {
  MlpConfig config;
  std::uint64_t seed = 0;
  OptimizerConfig optimizer;
  int num_microbatches = 1;  // M: each step splits its global batch into M equal parts
};

class ReferenceTrainer {
 public:
  // A host backend, one stream and the whole model as one Chunk. InvalidArgument for
  // num_microbatches < 1 or a bad model config.
  static absl::StatusOr<std::unique_ptr<ReferenceTrainer>> Create(const ReferenceOptions& options);
  ~ReferenceTrainer();

  // One training step on a global batch: x: (batch, d_in), labels: (batch), host memory;
  // batch must be a multiple of num_microbatches. Micro-batch losses get grad_scale
  // 1 / M. Returns the global batch's mean loss (mean of the M micro-batch losses).
  // Synchronous. InvalidArgument when batch is not a positive multiple of M, or for a
  // label out of range.
  absl::StatusOr<float> Step(const float* x, const std::int32_t* labels, int batch);

  // Synchronous; as Chunk::ExportParameters.
  absl::StatusOr<std::vector<HostTensor>> ExportParameters() const;
  Chunk& chunk() { return *chunk_; }

 private:
  ReferenceTrainer() = default;
  ReferenceOptions options_;
  std::unique_ptr<runtime::Backend> backend_;
  std::unique_ptr<runtime::Stream> stream_;
  std::unique_ptr<Chunk> chunk_;
};

}  // namespace pipesched::model
