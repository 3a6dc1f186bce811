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
#include "pipesched/stages/stage_work.h"

namespace pipesched::stages {

class SlowStageWork final : public ForwardingStageWork {
 public:
  // InvalidArgument unless factor >= 1 (and finite) and inner is set.
  static absl::StatusOr<std::unique_ptr<SlowStageWork>> Create(std::unique_ptr<StageWork> inner,
                                                               double factor);

  double factor() const { return factor_; }

  absl::Status Forward(const MicrobatchIO& io, runtime::Stream& stream) override;
  absl::Status Backward(const MicrobatchIO& io, runtime::Stream& stream) override;
  absl::Status BackwardInput(const MicrobatchIO& io, runtime::Stream& stream) override;
  absl::Status BackwardWeight(const MicrobatchIO& io, runtime::Stream& stream) override;

 private:
  SlowStageWork(std::unique_ptr<StageWork> inner, double factor)
      : ForwardingStageWork(std::move(inner)), factor_(factor) {}
  template <typename Fn>
  absl::Status Stretched(runtime::Stream& stream, Fn&& enqueue_work);
  double factor_;
};

}  // namespace pipesched::stages
