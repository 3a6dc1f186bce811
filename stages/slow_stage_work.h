// SlowStageWork: skew injection for bubble studies. Wraps any StageWork and makes each
// of its F, B, I and W really `factor` times longer on the stream: a host function
// before the wrapped work reads the clock, one after it holds the stream for
// (factor - 1) x the time the work just took. The extra time is stream time, so the
// measured timeline, the events and every stream waiting on this stage see it, exactly as
// they would see a slower device; it is not compute (the worker sleeps), so a host run
// on a few cores is not slowed further by CPU contention.
//
// On CUDA the two host functions (cudaLaunchHostFunc) hold the stream too, but CUDA
// may serialise host functions of different streams: use it on the host backend.
#pragma once

#include <memory>

#include "absl/status/statusor.h"
#include "stages/stage_work.h"

namespace pipesched::stages {

class SlowStageWork final : public StageWork {
 public:
  // InvalidArgument unless factor >= 1 (and finite) and inner is set.
  static absl::StatusOr<std::unique_ptr<SlowStageWork>> Create(std::unique_ptr<StageWork> inner,
                                                               double factor);

  StageWork& inner() const { return *inner_; }
  double factor() const { return factor_; }

  std::size_t input_bytes() const override { return inner_->input_bytes(); }
  std::size_t output_bytes() const override { return inner_->output_bytes(); }
  std::size_t target_bytes() const override { return inner_->target_bytes(); }
  std::int64_t stash_bytes() const override { return inner_->stash_bytes(); }
  std::int64_t workspace_bytes() const override { return inner_->workspace_bytes(); }
  std::int64_t num_params() const override { return inner_->num_params(); }
  absl::StatusOr<std::unique_ptr<ActivationStash>> AllocateStash(runtime::Stream& stream) override {
    return inner_->AllocateStash(stream);
  }
  absl::Status Forward(const MicrobatchIO& io, runtime::Stream& stream) override;
  absl::Status Backward(const MicrobatchIO& io, runtime::Stream& stream) override;
  absl::Status BackwardInput(const MicrobatchIO& io, runtime::Stream& stream) override;
  absl::Status BackwardWeight(const MicrobatchIO& io, runtime::Stream& stream) override;
  absl::Status ZeroGrad(runtime::Stream& stream) override { return inner_->ZeroGrad(stream); }
  absl::Status OptimizerStep(runtime::Stream& stream) override {
    return inner_->OptimizerStep(stream);
  }
  std::vector<GradientSpan> gradients() override { return inner_->gradients(); }

 private:
  SlowStageWork(std::unique_ptr<StageWork> inner, double factor)
      : inner_(std::move(inner)), factor_(factor) {}
  template <typename Fn>
  absl::Status Stretched(runtime::Stream& stream, Fn&& enqueue_work);
  std::unique_ptr<StageWork> inner_;
  double factor_;
};

}  // namespace pipesched::stages
