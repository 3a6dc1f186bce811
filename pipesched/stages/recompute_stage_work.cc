// Activation recomputation around any StageWork (stages/recompute_stage_work.h).
#include "pipesched/stages/recompute_stage_work.h"

#include <utility>
#include <vector>

#include "pipesched/base/status.h"

namespace pipesched::stages {
namespace {

// Holds nothing from F to backward; the stash the backward rebuilds, until its end.
class RecomputeStash final : public ActivationStash {
 public:
  std::unique_ptr<ActivationStash> rebuilt;
  // Stashes whose stream-ordered free failed: work enqueued before it may still use them,
  // and destroying one frees it at once (runtime::Buffer), so they stay until the
  // executor drops this stash, which it does after the streams drained.
  std::vector<std::unique_ptr<ActivationStash>> parked;
  std::int64_t bytes() const override { return 0; }
  absl::Status FreeAsync(runtime::Stream& stream) override {
    if (rebuilt == nullptr) return absl::OkStatus();
    absl::Status status = rebuilt->FreeAsync(stream);
    if (status.ok()) {
      rebuilt.reset();
    } else {
      parked.push_back(std::move(rebuilt));
    }
    return status;
  }
};

absl::StatusOr<RecomputeStash*> Of(const MicrobatchIO& io) {
  if (io.stash == nullptr) {
    return absl::FailedPreconditionError("recomputation: the micro-batch has no stash");
  }
  return static_cast<RecomputeStash*>(io.stash);
}

}  // namespace

absl::StatusOr<std::unique_ptr<RecomputeStageWork>> RecomputeStageWork::Create(
    std::unique_ptr<StageWork> inner) {
  if (inner == nullptr) {
    return absl::InvalidArgumentError("recomputation needs a stage's work to wrap, got none");
  }
  if (inner->recomputes()) {
    return absl::InvalidArgumentError(
        "the stage's work recomputes its activations already (recomputes()); wrap it once");
  }
  return std::unique_ptr<RecomputeStageWork>(new RecomputeStageWork(std::move(inner)));
}

absl::StatusOr<std::unique_ptr<ActivationStash>> RecomputeStageWork::AllocateStash(
    runtime::Stream&) {
  return std::unique_ptr<ActivationStash>(std::make_unique<RecomputeStash>());
}

absl::Status RecomputeStageWork::Forward(const MicrobatchIO& io, runtime::Stream& stream) {
  PS_ASSIGN_OR_RETURN(RecomputeStash * outer, Of(io));
  // The wrapped F needs its stash while it runs; freed in stream order right behind it.
  PS_ASSIGN_OR_RETURN(std::unique_ptr<ActivationStash> stash, inner_->AllocateStash(stream));
  MicrobatchIO inner_io = io;
  inner_io.stash = stash.get();
  const absl::Status forward = inner_->Forward(inner_io, stream);
  const absl::Status freed = stash->FreeAsync(stream);
  if (!freed.ok()) outer->parked.push_back(std::move(stash));
  PS_RETURN_IF_ERROR(forward);
  return freed;
}

absl::StatusOr<MicrobatchIO> RecomputeStageWork::Rebuild(const MicrobatchIO& io,
                                                         runtime::Stream& stream) {
  PS_ASSIGN_OR_RETURN(RecomputeStash * outer, Of(io));
  if (outer->rebuilt != nullptr) {
    return absl::FailedPreconditionError(
        "recomputation: the micro-batch's backward ran already since its F (one B, or one I "
        "then one W, per F)");
  }
  PS_ASSIGN_OR_RETURN(outer->rebuilt, inner_->AllocateStash(stream));
  MicrobatchIO inner_io = io;
  inner_io.stash = outer->rebuilt.get();
  PS_RETURN_IF_ERROR(inner_->Forward(inner_io, stream));
  return inner_io;
}

absl::Status RecomputeStageWork::Backward(const MicrobatchIO& io, runtime::Stream& stream) {
  PS_ASSIGN_OR_RETURN(const MicrobatchIO inner_io, Rebuild(io, stream));
  PS_RETURN_IF_ERROR(inner_->Backward(inner_io, stream));
  // Freed now rather than with the executor's stash: the same point in stream order.
  PS_ASSIGN_OR_RETURN(RecomputeStash * outer, Of(io));
  return outer->FreeAsync(stream);
}

absl::Status RecomputeStageWork::BackwardInput(const MicrobatchIO& io, runtime::Stream& stream) {
  PS_ASSIGN_OR_RETURN(const MicrobatchIO inner_io, Rebuild(io, stream));
  return inner_->BackwardInput(inner_io, stream);
}

absl::Status RecomputeStageWork::BackwardWeight(const MicrobatchIO& io, runtime::Stream& stream) {
  PS_ASSIGN_OR_RETURN(RecomputeStash * outer, Of(io));
  if (outer->rebuilt == nullptr) {
    return absl::FailedPreconditionError(
        "recomputation: W of a micro-batch whose I did not run (I rebuilds the stash W reads)");
  }
  MicrobatchIO inner_io = io;
  inner_io.stash = outer->rebuilt.get();
  PS_RETURN_IF_ERROR(inner_->BackwardWeight(inner_io, stream));
  return outer->FreeAsync(stream);
}

}  // namespace pipesched::stages
