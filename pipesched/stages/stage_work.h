// StageWork: what one pipeline stage (one model chunk, or virtual stage) computes, as
// the executor sees it. The executor owns the schedule, the streams, the events, the
// boundary buffers and their transfers; a StageWork owns its parameters, gradients,
// optimizer state and the per-micro-batch activation stash. The built-in MLP
// (stages/mlp_stage_work.h) is one implementation; an embedder brings another.
//
// Every callback enqueues its work on `stream` (the stage's compute stream, the last
// parameter) and returns immediately; it must not block the host. On CUDA the raw
// cudaStream_t is stream.native_handle() (runtime::CudaStreamOf in
// runtime/cuda_runtime.h); on the host backend, enqueue closures with
// stream.EnqueueHost. All pointers are device pointers on the stage's device and stay
// valid until the enqueued work has run.
//
// Per micro-batch m the executor calls, in stream order on the compute stream:
//   AllocateStash -> Forward -> (Backward | BackwardInput -> ... -> BackwardWeight)
//   -> stash FreeAsync
// and per step: ZeroGrad before the first action, OptimizerStep after the last one (and
// after the data-parallel all-reduce of gradients()). All calls of one StageWork come
// from the executor's single host thread; the closures they enqueue run on the compute
// stream (host backend: that stream's worker thread), one at a time, in stream order.
// A callback must not synchronise (no Stream/Event/Device Synchronize, no
// cudaStreamSynchronize / cudaDeviceSynchronize, no blocking copy): the executor issues
// the whole step before it waits once at the end.
//
// Errors: a callback returns a non-OK status only for what it finds while enqueueing
// (a bad argument, an allocation that fails); the executor stops issuing and Step returns
// it. Work that fails while it runs returns its status from the enqueued closure (or, on
// CUDA, leaves a CUDA error): that poisons the stream and Executor::Step returns it.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "pipesched/runtime/runtime.h"

namespace pipesched::stages {

// What one micro-batch of one stage keeps from its F until its last backward action
// (B, or W when the backward is split). Move-only device memory behind an interface.
class ActivationStash {
 public:
  virtual ~ActivationStash() = default;
  // Device bytes held; equal to StageWork::stash_bytes().
  virtual std::int64_t bytes() const = 0;
  // Frees the memory once the work enqueued on `stream` so far has run (stream-ordered).
  virtual absl::Status FreeAsync(runtime::Stream& stream) = 0;
};

// The buffers of one micro-batch of one stage. Device memory of the stage's device.
struct MicrobatchIO {
  int microbatch = 0;
  // F reads: (first stage) the micro-batch's slice of the step's inputs, else the
  // previous stage's output as received.
  const void* input = nullptr;
  // F writes: the stage's output, sent to the next stage. nullptr on the last stage.
  void* output = nullptr;
  // Last stage only: the micro-batch's slice of the step's targets (target_bytes()).
  const void* targets = nullptr;
  // Last stage only: F writes the micro-batch's loss (one float).
  float* loss = nullptr;
  // Last stage: the backward computes the gradient of loss_scale * loss (1 / M, so that
  // gradients accumulated over M micro-batches are those of the mean loss).
  float loss_scale = 1.0f;
  // B/I read: d(loss)/d(output), as received from the next stage. nullptr on the last
  // stage (it starts the backward from its loss).
  const void* grad_output = nullptr;
  // B/I write: d(loss)/d(input), sent to the previous stage. nullptr on the first stage
  // (nobody needs it; skip computing it).
  void* grad_input = nullptr;
  // The micro-batch's stash, from AllocateStash.
  ActivationStash* stash = nullptr;
};

// A contiguous range of fp32 gradients on the stage's device; the data-parallel
// all-reduce averages each range across replicas.
struct GradientSpan {
  float* data = nullptr;
  std::size_t count = 0;
};

class StageWork {
 public:
  virtual ~StageWork() = default;

  // Sizes per micro-batch, in bytes. The executor checks output_bytes() of stage s
  // against input_bytes() of stage s+1.
  virtual std::size_t input_bytes() const = 0;
  virtual std::size_t output_bytes() const = 0;  // 0 on the last stage
  virtual std::size_t target_bytes() const = 0;  // > 0 on the last stage only
  // What AllocateStash takes, per micro-batch (the simulator's activation bytes are
  // this plus the executor's received input and boundary buffers:
  // Executor::activation_bytes()).
  virtual std::int64_t stash_bytes() const = 0;
  // Scratch that one B or I allocates for its own duration (stream-ordered through the
  // stage's runtime::Device, freed before it ends), per micro-batch; 0 when none. The
  // simulator adds it to the live stashes while a B or I runs
  // (scheduler::StageCosts::workspace_bytes), so that its peak matches the runtime's.
  virtual std::int64_t workspace_bytes() const { return 0; }
  // Activation recomputation (stages/recompute_stage_work.h): what the stage's F holds
  // only while it runs and its B or I rebuilds, held from the start of the B or I to the
  // end of the B, or of the W when split (allocated through the stage's runtime::Device,
  // stream-ordered). 0 for a stage that keeps its stash from F to backward. What
  // scheduler::StageCosts::recompute_bytes wants.
  virtual std::int64_t recompute_bytes() const { return 0; }
  // The stage's B and I run its F again first (activation recomputation), even when that
  // rebuilds nothing; what scheduler::StageCosts::recompute wants.
  virtual bool recomputes() const { return recompute_bytes() > 0; }
  virtual std::int64_t num_params() const = 0;

  // A stash for one micro-batch, usable by work enqueued on `stream` after this call
  // (stream-ordered allocation through the stage's runtime::Device, so that the
  // runtime's memory accounting sees it). Returns immediately; ResourceExhausted from
  // runtime::Device::Allocate when the device is full.
  virtual absl::StatusOr<std::unique_ptr<ActivationStash>> AllocateStash(
      runtime::Stream& stream) = 0;

  // F of micro-batch io.microbatch: reads io.input, writes io.output (or, on the last
  // stage, *io.loss from io.targets) and keeps what the backward needs in io.stash.
  // Enqueued on `stream`; returns immediately. `io` itself is valid during the call
  // only: copy the pointers into what you enqueue.
  virtual absl::Status Forward(const MicrobatchIO& io, runtime::Stream& stream) = 0;
  // Full backward; the default is BackwardInput then BackwardWeight.
  virtual absl::Status Backward(const MicrobatchIO& io, runtime::Stream& stream);
  // Gradient w.r.t. the stage input (I), then w.r.t. the weights (W), accumulated into
  // the gradients (W adds; never overwrites). I writes io.grad_input (when not null) from
  // io.grad_output (or the loss, on the last stage) and the stash; W reads the stash only.
  // Both enqueued on `stream`; return immediately.
  virtual absl::Status BackwardInput(const MicrobatchIO& io, runtime::Stream& stream) = 0;
  virtual absl::Status BackwardWeight(const MicrobatchIO& io, runtime::Stream& stream) = 0;

  // Sets the gradients to zero; updates the parameters from them. Enqueued on `stream`
  // (the compute stream); return immediately.
  virtual absl::Status ZeroGrad(runtime::Stream& stream) = 0;
  virtual absl::Status OptimizerStep(runtime::Stream& stream) = 0;
  // The gradient memory the all-reduce averages; the same ranges (counts) on every
  // replica of a stage. Stable for the StageWork's lifetime.
  virtual std::vector<GradientSpan> gradients() = 0;
};

inline absl::Status StageWork::Backward(const MicrobatchIO& io, runtime::Stream& stream) {
  absl::Status s = BackwardInput(io, stream);
  if (!s.ok()) return s;
  return BackwardWeight(io, stream);
}

// A StageWork that hands every call to another it owns: the base of wrappers that change
// only some of them (SlowStageWork, RecomputeStageWork). `inner` must not be null (the
// wrappers' Create functions check it).
class ForwardingStageWork : public StageWork {
 public:
  StageWork& inner() const { return *inner_; }

  std::size_t input_bytes() const override { return inner_->input_bytes(); }
  std::size_t output_bytes() const override { return inner_->output_bytes(); }
  std::size_t target_bytes() const override { return inner_->target_bytes(); }
  std::int64_t stash_bytes() const override { return inner_->stash_bytes(); }
  std::int64_t workspace_bytes() const override { return inner_->workspace_bytes(); }
  std::int64_t recompute_bytes() const override { return inner_->recompute_bytes(); }
  bool recomputes() const override { return inner_->recomputes(); }
  std::int64_t num_params() const override { return inner_->num_params(); }
  absl::StatusOr<std::unique_ptr<ActivationStash>> AllocateStash(runtime::Stream& stream) override {
    return inner_->AllocateStash(stream);
  }
  absl::Status Forward(const MicrobatchIO& io, runtime::Stream& stream) override {
    return inner_->Forward(io, stream);
  }
  absl::Status Backward(const MicrobatchIO& io, runtime::Stream& stream) override {
    return inner_->Backward(io, stream);
  }
  absl::Status BackwardInput(const MicrobatchIO& io, runtime::Stream& stream) override {
    return inner_->BackwardInput(io, stream);
  }
  absl::Status BackwardWeight(const MicrobatchIO& io, runtime::Stream& stream) override {
    return inner_->BackwardWeight(io, stream);
  }
  absl::Status ZeroGrad(runtime::Stream& stream) override { return inner_->ZeroGrad(stream); }
  absl::Status OptimizerStep(runtime::Stream& stream) override {
    return inner_->OptimizerStep(stream);
  }
  std::vector<GradientSpan> gradients() override { return inner_->gradients(); }

 protected:
  explicit ForwardingStageWork(std::unique_ptr<StageWork> inner) : inner_(std::move(inner)) {}
  std::unique_ptr<StageWork> inner_;
};

}  // namespace pipesched::stages
