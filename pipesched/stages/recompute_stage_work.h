// RecomputeStageWork: activation recomputation (activation checkpointing) around any
// StageWork. Its F runs the wrapped F into a stash that it frees as soon as that F
// ends, so that between a micro-batch's F and its backward the stage holds nothing of
// its own (the executor still holds the micro-batch's input and boundary buffers, which
// the wrapped F read and wrote); its B or I first runs the wrapped F again from the same
// input into a new stash, then the wrapped B or I from it, and that stash lives until the
// end of the B, or of the W when the backward is split. Memory per in-flight micro-batch
// drops by the wrapped stash_bytes(); each backward costs one more F.
//
//   stash_bytes()     0 (what it keeps from F to backward)
//   recompute_bytes() the wrapped stash_bytes(): held while an F runs, and from the start
//                     of a B or I to the end of the B or W (scheduler::StageCosts)
//   workspace_bytes() the wrapped workspace_bytes()
//
// The second F must rebuild the stash the first one would have kept: the wrapped Forward
// must be a function of the micro-batch's input (and targets, on the last stage) and the
// parameters alone. A stage with dropout must replay its random numbers. It writes
// io.output (and, on the last stage, *io.loss) again, with the values of the first run:
// the executor has moved the output to the next stage by then (the backward waits for
// the next stage's, which waited for that copy).
//
// Every callback enqueues on `stream` and returns immediately, as StageWork's do.
#pragma once

#include <memory>

#include "absl/status/statusor.h"
#include "pipesched/stages/stage_work.h"

namespace pipesched::stages {

class RecomputeStageWork final : public ForwardingStageWork {
 public:
  // InvalidArgument when inner is null or already recomputes (recomputes()).
  static absl::StatusOr<std::unique_ptr<RecomputeStageWork>> Create(
      std::unique_ptr<StageWork> inner);

  std::int64_t stash_bytes() const override { return 0; }
  std::int64_t recompute_bytes() const override { return inner_->stash_bytes(); }
  bool recomputes() const override { return true; }
  absl::StatusOr<std::unique_ptr<ActivationStash>> AllocateStash(runtime::Stream& stream) override;
  absl::Status Forward(const MicrobatchIO& io, runtime::Stream& stream) override;
  absl::Status Backward(const MicrobatchIO& io, runtime::Stream& stream) override;
  absl::Status BackwardInput(const MicrobatchIO& io, runtime::Stream& stream) override;
  absl::Status BackwardWeight(const MicrobatchIO& io, runtime::Stream& stream) override;

 private:
  explicit RecomputeStageWork(std::unique_ptr<StageWork> inner)
      : ForwardingStageWork(std::move(inner)) {}
  // Runs the wrapped F of `io` into a new stash of the wrapped work's and returns `io`
  // pointing at it (the stash is kept in io.stash's RecomputeStash).
  absl::StatusOr<MicrobatchIO> Rebuild(const MicrobatchIO& io, runtime::Stream& stream);
};

}  // namespace pipesched::stages
