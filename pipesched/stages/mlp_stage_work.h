// The built-in MLP (model/) as a StageWork: one model::Chunk of layers [first, last)
// on the stage's device, micro-batches of a fixed size. The last chunk (holding the
// head) computes the softmax cross-entropy loss in its F and keeps dlogits in its stash
// for its backward; its "targets" are int32 labels.
//   input:   (B, in_features) fp32          output: (B, out_features) fp32, 0 on the head
//   targets: (B) int32 on the head chunk    stash:  the chunk's stash (+ (B, classes) on the head)
#pragma once

#include <memory>

#include "absl/status/statusor.h"
#include "pipesched/model/chunk.h"
#include "pipesched/runtime/runtime.h"
#include "pipesched/stages/stage_work.h"

namespace pipesched::stages {

class MlpStageWork final : public StageWork {
 public:
  // InvalidArgument for a bad config, range or micro-batch size.
  static absl::StatusOr<std::unique_ptr<MlpStageWork>> Create(const model::ChunkOptions& options,
                                                              int microbatch_size,
                                                              runtime::Device& device);

  model::Chunk& chunk() const { return *chunk_; }
  int microbatch_size() const { return batch_; }

  std::size_t input_bytes() const override;
  std::size_t output_bytes() const override;
  std::size_t target_bytes() const override;
  std::int64_t stash_bytes() const override;
  std::int64_t workspace_bytes() const override;
  std::int64_t num_params() const override { return chunk_->num_params(); }
  absl::StatusOr<std::unique_ptr<ActivationStash>> AllocateStash(runtime::Stream& stream) override;
  absl::Status Forward(const MicrobatchIO& io, runtime::Stream& stream) override;
  absl::Status Backward(const MicrobatchIO& io, runtime::Stream& stream) override;
  absl::Status BackwardInput(const MicrobatchIO& io, runtime::Stream& stream) override;
  absl::Status BackwardWeight(const MicrobatchIO& io, runtime::Stream& stream) override;
  absl::Status ZeroGrad(runtime::Stream& stream) override { return chunk_->ZeroGrad(stream); }
  absl::Status OptimizerStep(runtime::Stream& stream) override { return chunk_->Step(stream); }
  std::vector<GradientSpan> gradients() override;

 private:
  MlpStageWork(std::unique_ptr<model::Chunk> chunk, int batch)
      : chunk_(std::move(chunk)), batch_(batch) {}
  std::unique_ptr<model::Chunk> chunk_;
  int batch_;
};

}  // namespace pipesched::stages
