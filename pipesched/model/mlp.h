// The built-in model, defined precisely so that its results can be checked against any
// other framework (PyTorch equivalent in model/README.md):
//   x: (B, d_in)
//   L hidden blocks; block i (layer i): z = h W_i^T + b_i, h = gelu(z) + (h if the
//     block's in == out features, i.e. every block but the first unless
//     d_in == d_hidden)
//   head (layer L): logits = h W_head^T + b_head, logits: (B, num_classes)
//   loss = mean over the batch of softmax cross-entropy against int32 labels
// GELU is the exact erf form. Parameters follow nn.Linear: blocks.{i}.weight (out, in),
// blocks.{i}.bias (out), head.weight (num_classes, d_hidden), head.bias (num_classes).
//
// Layers are numbered 0..L (L = the head); a pipeline stage holds a contiguous range
// [first, last) of them. Initialisation is nn.Linear's U(-1/sqrt(in), 1/sqrt(in)) for
// weights and biases, drawn from a counter-based generator keyed by (seed, layer,
// tensor, element): any range of layers initialises identically however the model is
// partitioned. This file is pure host code, no device.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace pipesched::model {

struct MlpConfig {
  int d_in = 64;
  int d_hidden = 256;
  int num_classes = 10;
  int num_layers = 4;  // hidden blocks L >= 1; the model has L + 1 layers (blocks + head)

  int num_model_layers() const { return num_layers + 1; }
  // InvalidArgument naming the field and its value unless every size is in [1, its limit]: d_in and
  // d_hidden up to kMaxWidth, num_classes up to kMaxClasses, num_layers up to kMaxLayers.
  absl::Status Validate() const;
  static constexpr int kMaxWidth = 1 << 16;
  static constexpr int kMaxClasses = 1 << 20;
  static constexpr int kMaxLayers = 4096;
  // InvalidArgument unless 0 <= first < last <= num_model_layers().
  absl::Status ValidateRange(int first, int last) const;
};

struct LayerShape {
  std::string name;  // "blocks.3" or "head"
  int in = 0;
  int out = 0;
  bool gelu = false;      // blocks: true; head: false
  bool residual = false;  // blocks with in == out
};

// Layer `layer` in [0, num_model_layers()).
LayerShape LayerAt(const MlpConfig& config, int layer);

struct ParamSpec {
  std::string name;                 // "blocks.0.weight"
  std::vector<std::int64_t> shape;  // (out, in) or (out)
  int layer = 0;
  bool is_bias = false;
  std::int64_t numel() const;
};

// Parameters of layers [first, last) in order: for each layer its weight, then its bias.
// This is also their order in a Chunk's contiguous parameter buffer.
std::vector<ParamSpec> ParamSpecs(const MlpConfig& config, int first, int last);
std::int64_t ParamCount(const MlpConfig& config, int first, int last);

// Fills `out` (spec.numel() floats) with the initial values of `spec`.
void InitParameter(const MlpConfig& config, std::uint64_t seed, const ParamSpec& spec, float* out);
// The same for elements [begin, begin + count) of `spec` only (out: count floats); each
// element's value depends on its index alone, so pieces make up the whole.
void InitParameterRange(const MlpConfig& config, std::uint64_t seed, const ParamSpec& spec,
                        std::int64_t begin, std::int64_t count, float* out);

// Bytes per sample that layers [first, last) keep from their forward (F) to their
// backward (I and W): per block its input (in floats) and its pre-activation z (out
// floats, overwritten by dz during I); for the head its input (d_hidden) and dlogits
// (num_classes). The chunk's output is not kept. A micro-batch of B samples stashes
// B * ActivationBytesPerSample bytes on the stage's device.
std::int64_t ActivationBytesPerSample(const MlpConfig& config, int first, int last);

// Floating-point operations per sample of layers [first, last), for cost models:
// F (gemm + bias + gelu + residual), I (dx gemm + gelu'), W (dW gemm + bias grad).
struct LayerFlops {
  double forward = 0;
  double backward_input = 0;
  double backward_weight = 0;
};
LayerFlops FlopsPerSample(const MlpConfig& config, int first, int last);

// The counter-based generator behind initialisation and synthetic data: a pure function
// of its arguments (SplitMix64 finaliser over a mix of the key words).
std::uint64_t CounterHash(std::uint64_t seed, std::uint64_t stream, std::uint64_t counter);
// Uniform in [0, 1) with 24 random bits.
float CounterUniform(std::uint64_t seed, std::uint64_t stream, std::uint64_t counter);
// Standard normal (Box-Muller on two counters 2*counter, 2*counter+1).
float CounterNormal(std::uint64_t seed, std::uint64_t stream, std::uint64_t counter);

}  // namespace pipesched::model
