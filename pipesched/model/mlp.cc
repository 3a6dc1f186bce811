// Model definition helpers: layer shapes, parameter specs, deterministic init, stash and
// flop accounting, the counter-based generator.
#include "pipesched/model/mlp.h"

#include <cmath>
#include <numbers>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace pipesched::model {
namespace {

constexpr std::uint64_t kGolden = 0x9E3779B97F4A7C15ull;

std::uint64_t SplitMix64(std::uint64_t z) {
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

}  // namespace

absl::Status MlpConfig::Validate() const {
  // The upper limits are the command line's: sizes whose products (parameters, bytes)
  // stay far inside 64 bits.
  const struct {
    const char* name;
    int value;
    int max;
  } fields[] = {{"d_in", d_in, kMaxWidth},
                {"d_hidden", d_hidden, kMaxWidth},
                {"num_classes", num_classes, kMaxClasses},
                {"num_layers", num_layers, kMaxLayers}};
  for (const auto& f : fields) {
    if (f.value < 1 || f.value > f.max) {
      return absl::InvalidArgumentError(
          absl::StrFormat("model %s must be in [1, %d], got %d", f.name, f.max, f.value));
    }
  }
  return absl::OkStatus();
}

absl::Status MlpConfig::ValidateRange(int first, int last) const {
  if (first < 0 || last > num_model_layers() || first >= last) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "layer range [%d, %d) is not a non-empty range within the model's %d layers "
        "(%d blocks + head); need 0 <= first < last <= %d",
        first, last, num_model_layers(), num_layers, num_model_layers()));
  }
  return absl::OkStatus();
}

LayerShape LayerAt(const MlpConfig& config, int layer) {
  LayerShape s;
  if (layer == config.num_layers) {
    s.name = "head";
    s.in = config.d_hidden;
    s.out = config.num_classes;
    return s;
  }
  s.name = absl::StrCat("blocks.", layer);
  s.in = layer == 0 ? config.d_in : config.d_hidden;
  s.out = config.d_hidden;
  s.gelu = true;
  s.residual = s.in == s.out;
  return s;
}

std::int64_t ParamSpec::numel() const {
  std::int64_t n = 1;
  for (std::int64_t d : shape) n *= d;
  return n;
}

std::vector<ParamSpec> ParamSpecs(const MlpConfig& config, int first, int last) {
  std::vector<ParamSpec> specs;
  for (int layer = first; layer < last; ++layer) {
    LayerShape s = LayerAt(config, layer);
    specs.push_back({absl::StrCat(s.name, ".weight"), {s.out, s.in}, layer, false});
    specs.push_back({absl::StrCat(s.name, ".bias"), {s.out}, layer, true});
  }
  return specs;
}

std::int64_t ParamCount(const MlpConfig& config, int first, int last) {
  std::int64_t n = 0;
  for (const ParamSpec& spec : ParamSpecs(config, first, last)) n += spec.numel();
  return n;
}

void InitParameterRange(const MlpConfig& config, std::uint64_t seed, const ParamSpec& spec,
                        std::int64_t begin, std::int64_t count, float* out) {
  const LayerShape s = LayerAt(config, spec.layer);
  const float bound = 1.0f / std::sqrt(static_cast<float>(s.in));
  // Stream 2*layer (+1 for the bias): independent of the partitioning.
  const std::uint64_t stream = 2 * static_cast<std::uint64_t>(spec.layer) + (spec.is_bias ? 1 : 0);
  for (std::int64_t i = 0; i < count; ++i) {
    const auto index = static_cast<std::uint64_t>(begin + i);
    out[i] = bound * (2.0f * CounterUniform(seed, stream, index) - 1.0f);
  }
}

void InitParameter(const MlpConfig& config, std::uint64_t seed, const ParamSpec& spec, float* out) {
  InitParameterRange(config, seed, spec, 0, spec.numel(), out);
}

std::int64_t ActivationBytesPerSample(const MlpConfig& config, int first, int last) {
  std::int64_t floats = 0;
  for (int layer = first; layer < last; ++layer) {
    LayerShape s = LayerAt(config, layer);
    floats += s.in + s.out;  // block: input + z (then dz); head: input + dlogits
  }
  return floats * static_cast<std::int64_t>(sizeof(float));
}

LayerFlops FlopsPerSample(const MlpConfig& config, int first, int last) {
  LayerFlops f;
  for (int layer = first; layer < last; ++layer) {
    LayerShape s = LayerAt(config, layer);
    const double gemm = 2.0 * s.in * s.out;
    f.forward += gemm + s.out;  // + bias
    f.backward_input += gemm;
    f.backward_weight += gemm + s.out;  // + bias grad
    if (s.gelu) {
      f.forward += 20.0 * s.out;  // erf-based gelu, a rough count
      f.backward_input += 25.0 * s.out;
    }
    if (s.residual) {
      f.forward += s.out;
      f.backward_input += s.out;
    }
  }
  return f;
}

std::uint64_t CounterHash(std::uint64_t seed, std::uint64_t stream, std::uint64_t counter) {
  std::uint64_t h = SplitMix64(seed + kGolden);
  h = SplitMix64(h ^ (stream + kGolden * 3));
  return SplitMix64(h ^ (counter * kGolden + 0x632BE59BD9B4E019ull));
}

float CounterUniform(std::uint64_t seed, std::uint64_t stream, std::uint64_t counter) {
  return static_cast<float>(CounterHash(seed, stream, counter) >> 40) * 0x1.0p-24f;
}

float CounterNormal(std::uint64_t seed, std::uint64_t stream, std::uint64_t counter) {
  // u1 in (0, 1] so that log(u1) is finite.
  const double u1 =
      (static_cast<double>(CounterHash(seed, stream, 2 * counter) >> 11) + 1.0) * 0x1.0p-53;
  const double u2 =
      static_cast<double>(CounterHash(seed, stream, 2 * counter + 1) >> 11) * 0x1.0p-53;
  return static_cast<float>(std::sqrt(-2.0 * std::log(u1)) * std::cos(2.0 * std::numbers::pi * u2));
}

}  // namespace pipesched::model
