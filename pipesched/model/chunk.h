// A Chunk is a contiguous range of layers [first, last) of the MLP (model/mlp.h) living
// on one device: its parameters, gradients and optimizer state (each one contiguous
// buffer, in ParamSpecs order, so that an all-reduce is one call), and the forward,
// backward-input (I) and backward-weight (W) of the range. A pipeline stage (or a
// virtual stage of an interleaved schedule) is one Chunk; the whole model on one device
// is Chunk [0, L + 1).
//
// Per micro-batch the executor owns a Stash (AllocateStash) that carries what the
// backward needs from F to I and W (ActivationBytesPerSample bytes per sample):
//   Forward(x, stash, y)          x: (B, in_features), y: (B, out_features)
//   Loss(logits, labels, ...)     last chunk only: loss scalar and dlogits (B, classes)
//   BackwardInput(dy, stash, dx)  dy: (B, out_features), dx: (B, in_features)
//   BackwardWeight(stash)         grads += dW, db of every layer of the chunk
//   Backward = BackwardInput then BackwardWeight (B = I + W)
// I overwrites the stash's pre-activations with their gradients, which W reads: call
// each at most once per Forward, I before W. The stash may be freed once W is enqueued
// (FreeAsync on the same stream, or on another after an event).
//
// Loss scaling: Loss writes the micro-batch's mean cross-entropy to `loss` and
// dlogits = grad_scale * d(mean loss)/d(logits). With M equal micro-batches of a global
// batch, pass grad_scale = 1 / M: gradients accumulated over the M micro-batches (W
// always adds into the gradient buffer) then equal the gradient of the global batch's
// mean loss, and the global loss is the mean of the M losses. ZeroGrad between steps.
//
// Every method that takes a stream enqueues on it and returns immediately; the
// pointers are device pointers of the chunk's device and must stay valid until the
// enqueued work ran. A chunk's work must all go to streams of its device, issued from
// one host thread. Export/Import are synchronous: synchronize the chunk's streams first.
// Errors: FailedPrecondition for an empty stash (or Loss on a chunk without the head),
// the stream's errors (runtime/runtime.h); math errors while the work runs poison the
// stream (model/math.h).
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "pipesched/model/math.h"
#include "pipesched/model/mlp.h"
#include "pipesched/model/optimizer.h"
#include "pipesched/model/safetensors.h"
#include "pipesched/runtime/runtime.h"

namespace pipesched::model {

struct ChunkOptions {
  MlpConfig config;
  int first_layer = 0;  // layers [first_layer, last_layer); L is the head
  int last_layer = 0;
  std::uint64_t seed = 0;  // parameter initialisation (see InitParameter)
  OptimizerConfig optimizer;
};

// What one micro-batch keeps from F to I/W on the chunk's device. Move-only.
class Stash {
 public:
  Stash() = default;
  int batch() const { return batch_; }
  std::size_t bytes() const { return buffer_.size(); }
  // Frees the memory after the work enqueued on `stream` so far (stream-ordered).
  absl::Status FreeAsync(runtime::Stream& stream) { return buffer_.FreeAsync(stream); }

 private:
  friend class Chunk;
  runtime::Buffer buffer_;
  int batch_ = 0;
};

class Chunk {
 public:
  // Allocates and initialises parameters (synchronous copies), zeroes gradients and
  // optimizer state; everything is ready when Create returns. InvalidArgument for a bad
  // config or range.
  static absl::StatusOr<std::unique_ptr<Chunk>> Create(const ChunkOptions& options,
                                                       runtime::Device& device);
  ~Chunk();
  Chunk(const Chunk&) = delete;
  Chunk& operator=(const Chunk&) = delete;

  const ChunkOptions& options() const { return options_; }
  runtime::Device& device() const { return *device_; }
  Math& math() const { return *math_; }
  int first_layer() const { return options_.first_layer; }
  int last_layer() const { return options_.last_layer; }
  bool has_head() const;     // holds layer L
  int in_features() const;   // of its first layer
  int out_features() const;  // of its last layer (num_classes with the head)
  std::int64_t activation_bytes_per_sample() const;  // ActivationBytesPerSample(range)
  // What one BackwardInput (or Backward) of `batch` samples allocates while it runs: the
  // (batch, d_hidden) gradient between the chunk's layers; 0 for a one-layer chunk.
  std::int64_t backward_workspace_bytes(int batch) const;
  const std::vector<ParamSpec>& param_specs() const { return specs_; }
  std::int64_t num_params() const { return num_params_; }
  // Bytes held for the chunk's whole life: parameters, gradients and optimizer state.
  std::int64_t state_bytes() const { return StateBytes(num_params_, options_.optimizer); }

  // Contiguous parameter and gradient storage (num_params() floats, ParamSpecs order).
  float* params() const;
  float* grads() const;

  // A stash for micro-batches of `batch` samples, usable by work enqueued on `stream`
  // after this call (stream-ordered allocation). InvalidArgument for batch < 1;
  // ResourceExhausted when the device is full.
  absl::StatusOr<Stash> AllocateStash(int batch, runtime::Stream& stream);

  // x: (B, in_features) -> y: (B, out_features), B = stash.batch(). x may be reused by
  // the caller once this work ran (the chunk copies what it needs into the stash).
  absl::Status Forward(const float* x, Stash& stash, float* y, runtime::Stream& stream);

  // Last chunk only (FailedPrecondition otherwise). logits, dlogits: (batch, classes),
  // labels: (batch) int32, loss: one float = mean cross-entropy of the batch;
  // dlogits = grad_scale / batch * (softmax - onehot). dlogits may alias logits.
  absl::Status Loss(const float* logits, const std::int32_t* labels, int batch, float grad_scale,
                    float* loss, float* dlogits, runtime::Stream& stream);

  // dy: (B, out_features) -> dx: (B, in_features). dx may be null when nobody needs it
  // (first chunk): its gemm is skipped.
  absl::Status BackwardInput(const float* dy, Stash& stash, float* dx, runtime::Stream& stream);
  // grads += dW, db of the chunk's layers, from the stash after BackwardInput.
  absl::Status BackwardWeight(Stash& stash, runtime::Stream& stream);
  // BackwardInput then BackwardWeight.
  absl::Status Backward(const float* dy, Stash& stash, float* dx, runtime::Stream& stream);

  absl::Status ZeroGrad(runtime::Stream& stream);
  // One optimizer update of every parameter from the accumulated gradients; counts
  // steps (AdamW bias correction).
  absl::Status Step(runtime::Stream& stream);
  std::int64_t step_count() const { return step_count_; }

  // Synchronous; named and shaped as in ParamSpecs ("blocks.1.weight": (out, in)).
  absl::StatusOr<std::vector<HostTensor>> ExportParameters() const;
  absl::StatusOr<std::vector<HostTensor>> ExportGradients() const;
  // Sets every parameter of the chunk from `tensors` found by name; tensors of other
  // layers are ignored (a whole-model file loads into any chunk). NotFound for a missing
  // parameter, InvalidArgument for a wrong dtype or shape, naming the tensor.
  // Checks every tensor before copying any: on an error the chunk keeps its parameters.
  absl::Status ImportParameters(const std::vector<HostTensor>& tensors);
  // ImportParameters' checks alone (names, dtypes, shapes, finite values), copying nothing.
  absl::Status CheckParameters(const std::vector<HostTensor>& tensors) const;

  // Optimizer state, for checkpoints: SGD momentum buffers ("<param>.momentum"; none
  // without momentum) or AdamW's moments ("<param>.exp_avg", "<param>.exp_avg_sq"), shaped
  // as the parameters. Synchronous. Import sets them and the step count (AdamW's bias
  // correction); NotFound / InvalidArgument for a missing or misshapen tensor.
  absl::StatusOr<std::vector<HostTensor>> ExportOptimizerState() const;
  absl::Status ImportOptimizerState(const std::vector<HostTensor>& tensors,
                                    std::int64_t step_count);

 private:
  // Sets `dst` (num_params() floats, ParamSpecs order) from the tensors named
  // "<param><suffix>".
  absl::Status ImportInto(float* dst, const std::vector<HostTensor>& tensors,
                          const std::string& suffix);
  absl::Status CheckInto(const std::vector<HostTensor>& tensors, const std::string& suffix) const;
  Chunk(ChunkOptions options, runtime::Device& device, std::unique_ptr<Math> math);
  absl::StatusOr<std::vector<HostTensor>> Export(const float* src) const;

  ChunkOptions options_;
  runtime::Device* device_;
  std::unique_ptr<Math> math_;
  std::vector<ParamSpec> specs_;
  std::vector<std::int64_t> param_offsets_;  // per spec, in floats
  // Float offsets of layer j's stash slots (in_j, z_j) for a micro-batch of one sample;
  // a stash of B samples has them at B times these (every slot scales with B).
  std::vector<std::int64_t> slot_in_;
  std::vector<std::int64_t> slot_z_;
  std::int64_t num_params_ = 0;
  runtime::Buffer params_;
  runtime::Buffer grads_;
  runtime::Buffer state1_;  // SGD momentum or AdamW m
  runtime::Buffer state2_;  // AdamW v
  std::int64_t step_count_ = 0;
};

}  // namespace pipesched::model
