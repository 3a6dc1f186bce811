// Chunk: the layers [first, last) of the MLP on one device. The stash of a micro-batch
// of B samples is one buffer of slots, per layer j: in_j (B, in) then z_j (B, out); for
// the head z_j holds dlogits instead. F writes every in_j (the first by copying x) and
// z_j; I turns z_j into dz_j in place; W reads in_j and dz_j.
#include "pipesched/model/chunk.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "pipesched/base/status.h"
#include "pipesched/base/strings.h"

namespace pipesched::model {
namespace {

std::string ShapeString(const std::vector<std::int64_t>& shape) {
  return absl::StrCat("(", absl::StrJoin(shape, ", "), ")");
}

}  // namespace

Chunk::Chunk(ChunkOptions options, runtime::Device& device, std::unique_ptr<Math> math)
    : options_(std::move(options)), device_(&device), math_(std::move(math)) {}

Chunk::~Chunk() = default;

absl::StatusOr<std::unique_ptr<Chunk>> Chunk::Create(const ChunkOptions& options,
                                                     runtime::Device& device) {
  PS_RETURN_IF_ERROR(options.config.Validate());
  PS_RETURN_IF_ERROR(options.config.ValidateRange(options.first_layer, options.last_layer));
  PS_ASSIGN_OR_RETURN(std::unique_ptr<Math> math, CreateMath(device));
  std::unique_ptr<Chunk> chunk(new Chunk(options, device, std::move(math)));
  chunk->specs_ = ParamSpecs(options.config, options.first_layer, options.last_layer);
  for (const ParamSpec& spec : chunk->specs_) {
    chunk->param_offsets_.push_back(chunk->num_params_);
    chunk->num_params_ += spec.numel();
  }
  std::int64_t offset = 0;
  for (int layer = options.first_layer; layer < options.last_layer; ++layer) {
    const LayerShape s = LayerAt(options.config, layer);
    chunk->slot_in_.push_back(offset);
    offset += s.in;
    chunk->slot_z_.push_back(offset);
    offset += s.out;
  }
  const std::size_t bytes = static_cast<std::size_t>(chunk->num_params_) * sizeof(float);

  // Setup is synchronous: allocate on a private stream, wait for it, then initialise.
  // Device memory first, so that a model too large for the device is ResourceExhausted
  // before any host memory of its size is asked for.
  PS_ASSIGN_OR_RETURN(std::unique_ptr<runtime::Stream> setup,
                      device.CreateStream(absl::StrCat("chunk-setup-", options.first_layer)));
  PS_ASSIGN_OR_RETURN(chunk->params_, device.Allocate(bytes, *setup));
  PS_ASSIGN_OR_RETURN(chunk->grads_, device.Allocate(bytes, *setup));
  const OptimizerConfig& opt = options.optimizer;
  const int buffers = OptimizerStateBuffers(opt);
  if (buffers >= 1) {
    PS_ASSIGN_OR_RETURN(chunk->state1_, device.Allocate(bytes, *setup));
  }
  if (buffers >= 2) {
    PS_ASSIGN_OR_RETURN(chunk->state2_, device.Allocate(bytes, *setup));
  }
  for (runtime::Buffer* b : {&chunk->grads_, &chunk->state1_, &chunk->state2_}) {
    if (!*b) continue;
    PS_RETURN_IF_ERROR(chunk->math_->Fill(b->as<float>(), chunk->num_params_, 0.0f, *setup));
  }
  PS_RETURN_IF_ERROR(setup->Synchronize());
  // Parameters through a bounded host buffer: host memory does not grow with the model.
  constexpr std::int64_t kPiece = std::int64_t{1} << 20;  // floats
  std::vector<float> piece(static_cast<std::size_t>(std::min(kPiece, chunk->num_params_)));
  for (std::size_t i = 0; i < chunk->specs_.size(); ++i) {
    const ParamSpec& spec = chunk->specs_[i];
    for (std::int64_t begin = 0; begin < spec.numel(); begin += kPiece) {
      const std::int64_t count = std::min(kPiece, spec.numel() - begin);
      InitParameterRange(options.config, options.seed, spec, begin, count, piece.data());
      PS_RETURN_IF_ERROR(device.CopyFromHost(chunk->params() + chunk->param_offsets_[i] + begin,
                                             piece.data(), sizeof(float) * count));
    }
  }
  return chunk;
}

bool Chunk::has_head() const { return options_.last_layer == options_.config.num_layers + 1; }
int Chunk::in_features() const { return LayerAt(options_.config, options_.first_layer).in; }
int Chunk::out_features() const { return LayerAt(options_.config, options_.last_layer - 1).out; }
std::int64_t Chunk::activation_bytes_per_sample() const {
  return ActivationBytesPerSample(options_.config, options_.first_layer, options_.last_layer);
}
std::int64_t Chunk::backward_workspace_bytes(int batch) const {
  if (options_.last_layer - options_.first_layer < 2) return 0;
  return static_cast<std::int64_t>(sizeof(float)) * batch * options_.config.d_hidden;
}
float* Chunk::params() const { return params_.as<float>(); }
float* Chunk::grads() const { return grads_.as<float>(); }

absl::StatusOr<Stash> Chunk::AllocateStash(int batch, runtime::Stream& stream) {
  if (batch < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("micro-batch size must be at least 1, got ", batch));
  }
  Stash stash;
  stash.batch_ = batch;
  const std::size_t bytes = static_cast<std::size_t>(batch) * activation_bytes_per_sample();
  PS_ASSIGN_OR_RETURN(stash.buffer_, device_->Allocate(bytes, stream));
  return stash;
}

absl::Status Chunk::Forward(const float* x, Stash& stash, float* y, runtime::Stream& stream) {
  if (!stash.buffer_) return absl::FailedPreconditionError("Forward: the stash is empty");
  const int batch = stash.batch_;
  const int first = options_.first_layer;
  const int last = options_.last_layer;
  const MlpConfig& config = options_.config;
  float* base = stash.buffer_.as<float>();
  PS_RETURN_IF_ERROR(device_->CopyAsync(base + batch * slot_in_[0], x,
                                        sizeof(float) * batch * in_features(), *device_, stream));
  for (int layer = first; layer < last; ++layer) {
    const int j = layer - first;
    const LayerShape s = LayerAt(config, layer);
    const float* w = params() + param_offsets_[2 * j];
    const float* b = params() + param_offsets_[2 * j + 1];
    const float* in = base + batch * slot_in_[j];
    float* out = layer + 1 == last ? y : base + batch * slot_in_[j + 1];
    const std::int64_t n = static_cast<std::int64_t>(batch) * s.out;
    // Blocks keep z for gelu'; the head writes logits straight to the output.
    float* z = s.gelu ? base + batch * slot_z_[j] : out;
    // z: (B, out) = in (B, in) W^T (in, out) + b
    PS_RETURN_IF_ERROR(math_->Gemm(Transpose::kNo, Transpose::kYes, batch, s.out, s.in, 1.0f, in,
                                   s.in, w, s.in, 0.0f, z, s.out, stream));
    PS_RETURN_IF_ERROR(math_->AddBias(z, b, batch, s.out, stream));
    if (s.gelu) {
      PS_RETURN_IF_ERROR(math_->Gelu(z, out, n, stream));
      if (s.residual) PS_RETURN_IF_ERROR(math_->Add(out, in, out, n, stream));
    }
  }
  return absl::OkStatus();
}

absl::Status Chunk::Loss(const float* logits, const std::int32_t* labels, int batch,
                         float grad_scale, float* loss, float* dlogits, runtime::Stream& stream) {
  if (!has_head()) {
    return absl::FailedPreconditionError(absl::StrFormat(
        "Loss called on the chunk of layers [%d, %d), which does not hold the head (layer %d)",
        options_.first_layer, options_.last_layer, options_.config.num_layers));
  }
  if (batch < 1) {
    return absl::InvalidArgumentError(absl::StrCat("Loss: batch must be at least 1, got ", batch));
  }
  return math_->SoftmaxCrossEntropy(logits, labels, batch, options_.config.num_classes, grad_scale,
                                    loss, dlogits, stream);
}

absl::Status Chunk::BackwardInput(const float* dy, Stash& stash, float* dx,
                                  runtime::Stream& stream) {
  if (!stash.buffer_) return absl::FailedPreconditionError("BackwardInput: the stash is empty");
  const int batch = stash.batch_;
  const int first = options_.first_layer;
  const int last = options_.last_layer;
  const MlpConfig& config = options_.config;
  float* base = stash.buffer_.as<float>();

  // Gradients between the chunk's own layers flow through one (B, d_hidden) buffer,
  // updated in place by residual blocks (gemm with beta = 1); stream-ordered so that it
  // lives only for this call's work.
  runtime::Buffer between;
  if (const std::int64_t bytes = backward_workspace_bytes(batch); bytes > 0) {
    PS_ASSIGN_OR_RETURN(between, device_->Allocate(static_cast<std::size_t>(bytes), stream));
  }
  const float* g_out = dy;  // (B, out) gradient w.r.t. the current layer's output
  for (int layer = last - 1; layer >= first; --layer) {
    const int j = layer - first;
    const LayerShape s = LayerAt(config, layer);
    const float* w = params() + param_offsets_[2 * j];
    const std::int64_t n = static_cast<std::int64_t>(batch) * s.out;
    float* dz = base + batch * slot_z_[j];
    if (s.gelu) {
      PS_RETURN_IF_ERROR(math_->GeluBackward(dz, g_out, dz, n, stream));  // z -> dz
    } else {
      PS_RETURN_IF_ERROR(
          device_->CopyAsync(dz, g_out, sizeof(float) * n, *device_, stream));  // dlogits
    }
    float* g_in = layer == first ? dx : between.as<float>();
    if (g_in == nullptr) continue;
    float beta = 0.0f;
    if (s.residual) {
      if (g_in != g_out) {
        PS_RETURN_IF_ERROR(device_->CopyAsync(g_in, g_out, sizeof(float) * n, *device_, stream));
      }
      beta = 1.0f;
    }
    // g_in: (B, in) = dz (B, out) W (out, in) [+ g_out]
    PS_RETURN_IF_ERROR(math_->Gemm(Transpose::kNo, Transpose::kNo, batch, s.in, s.out, 1.0f, dz,
                                   s.out, w, s.in, beta, g_in, s.in, stream));
    g_out = g_in;
  }
  if (between) PS_RETURN_IF_ERROR(between.FreeAsync(stream));
  return absl::OkStatus();
}

absl::Status Chunk::BackwardWeight(Stash& stash, runtime::Stream& stream) {
  if (!stash.buffer_) return absl::FailedPreconditionError("BackwardWeight: the stash is empty");
  const int batch = stash.batch_;
  const int first = options_.first_layer;
  const int last = options_.last_layer;
  const float* base = stash.buffer_.as<float>();
  for (int layer = first; layer < last; ++layer) {
    const int j = layer - first;
    const LayerShape s = LayerAt(options_.config, layer);
    const float* in = base + batch * slot_in_[j];
    const float* dz = base + batch * slot_z_[j];
    float* dw = grads() + param_offsets_[2 * j];
    float* db = grads() + param_offsets_[2 * j + 1];
    // dW: (out, in) += dz^T (out, B) in (B, in)
    PS_RETURN_IF_ERROR(math_->Gemm(Transpose::kYes, Transpose::kNo, s.out, s.in, batch, 1.0f, dz,
                                   s.out, in, s.in, 1.0f, dw, s.in, stream));
    PS_RETURN_IF_ERROR(math_->ColumnSumAccumulate(dz, db, batch, s.out, stream));
  }
  return absl::OkStatus();
}

absl::Status Chunk::Backward(const float* dy, Stash& stash, float* dx, runtime::Stream& stream) {
  PS_RETURN_IF_ERROR(BackwardInput(dy, stash, dx, stream));
  return BackwardWeight(stash, stream);
}

absl::Status Chunk::ZeroGrad(runtime::Stream& stream) {
  return math_->Fill(grads(), num_params_, 0.0f, stream);
}

absl::Status Chunk::Step(runtime::Stream& stream) {
  ++step_count_;
  const OptimizerConfig& opt = options_.optimizer;
  switch (opt.kind) {
    case OptimizerKind::kSgd:
      return math_->SgdStep(params(), grads(), state1_.as<float>(), num_params_, opt.sgd, stream);
    case OptimizerKind::kAdamW:
      return math_->AdamWStep(params(), grads(), state1_.as<float>(), state2_.as<float>(),
                              num_params_, opt.adamw, step_count_, stream);
  }
  return absl::InternalError("unknown optimizer kind");
}

absl::StatusOr<std::vector<HostTensor>> Chunk::Export(const float* src) const {
  std::vector<HostTensor> out;
  for (std::size_t i = 0; i < specs_.size(); ++i) {
    std::vector<float> values(specs_[i].numel());
    PS_RETURN_IF_ERROR(
        device_->CopyToHost(values.data(), src + param_offsets_[i], sizeof(float) * values.size()));
    out.push_back(HostTensor::F32(specs_[i].name, specs_[i].shape, values));
  }
  return out;
}

absl::StatusOr<std::vector<HostTensor>> Chunk::ExportParameters() const { return Export(params()); }
absl::StatusOr<std::vector<HostTensor>> Chunk::ExportGradients() const { return Export(grads()); }

absl::Status Chunk::ImportParameters(const std::vector<HostTensor>& tensors) {
  return ImportInto(params(), tensors, "");
}

absl::Status Chunk::CheckParameters(const std::vector<HostTensor>& tensors) const {
  return CheckInto(tensors, "");
}

absl::StatusOr<std::vector<HostTensor>> Chunk::ExportOptimizerState() const {
  std::vector<HostTensor> out;
  auto add = [&](const runtime::Buffer& state, const char* suffix) -> absl::Status {
    if (!state) return absl::OkStatus();
    PS_ASSIGN_OR_RETURN(std::vector<HostTensor> part, Export(state.as<float>()));
    for (HostTensor& t : part) {
      t.name += suffix;
      out.push_back(std::move(t));
    }
    return absl::OkStatus();
  };
  const bool adamw = options_.optimizer.kind == OptimizerKind::kAdamW;
  PS_RETURN_IF_ERROR(add(state1_, adamw ? ".exp_avg" : ".momentum"));
  PS_RETURN_IF_ERROR(add(state2_, ".exp_avg_sq"));
  return out;
}

absl::Status Chunk::ImportOptimizerState(const std::vector<HostTensor>& tensors,
                                         std::int64_t step_count) {
  const bool adamw = options_.optimizer.kind == OptimizerKind::kAdamW;
  if (state1_) {
    PS_RETURN_IF_ERROR(ImportInto(state1_.as<float>(), tensors, adamw ? ".exp_avg" : ".momentum"));
  }
  if (state2_) PS_RETURN_IF_ERROR(ImportInto(state2_.as<float>(), tensors, ".exp_avg_sq"));
  step_count_ = step_count;
  return absl::OkStatus();
}

absl::Status Chunk::CheckInto(const std::vector<HostTensor>& tensors,
                              const std::string& suffix) const {
  for (std::size_t i = 0; i < specs_.size(); ++i) {
    const ParamSpec& spec = specs_[i];
    const std::string name = spec.name + suffix;
    auto it = std::find_if(tensors.begin(), tensors.end(),
                           [&](const HostTensor& t) { return t.name == name; });
    if (it == tensors.end()) {
      return absl::NotFoundError(
          absl::StrCat("parameter '", name, "' ", ShapeString(spec.shape), " is missing"));
    }
    if (it->dtype != DType::kF32) {
      return absl::InvalidArgumentError(absl::StrCat("parameter '", name, "' has dtype ",
                                                     Absl(DTypeName(it->dtype)), ", expected F32"));
    }
    if (it->shape != spec.shape) {
      return absl::InvalidArgumentError(absl::StrCat("parameter '", name, "' has shape ",
                                                     ShapeString(it->shape), ", expected ",
                                                     ShapeString(spec.shape)));
    }
    const std::size_t bytes = static_cast<std::size_t>(spec.numel()) * sizeof(float);
    if (it->bytes.size() != bytes) {
      return absl::InvalidArgumentError(absl::StrCat("parameter '", name, "' holds ",
                                                     it->bytes.size(), " bytes, but F32 ",
                                                     ShapeString(spec.shape), " needs ", bytes));
    }
    // A value that is not finite would make every loss NaN from the first step on; a
    // negative second moment, every AdamW update.
    const bool nonnegative = suffix == ".exp_avg_sq";
    for (std::size_t k = 0; k < it->bytes.size() / sizeof(float); ++k) {
      float v;
      std::memcpy(&v, it->bytes.data() + k * sizeof(float), sizeof(float));
      if (!std::isfinite(v) || (nonnegative && v < 0)) {
        return absl::InvalidArgumentError(
            absl::StrCat("parameter '", name, "' holds ", v, " at element ", k, ": ",
                         nonnegative ? "a second moment must be finite and >= 0"
                                     : "every value must be finite"));
      }
    }
  }
  return absl::OkStatus();
}

absl::Status Chunk::ImportInto(float* dst, const std::vector<HostTensor>& tensors,
                               const std::string& suffix) {
  // Every tensor is checked before any is copied: a bad one leaves the chunk as it was.
  PS_RETURN_IF_ERROR(CheckInto(tensors, suffix));
  for (std::size_t i = 0; i < specs_.size(); ++i) {
    const std::string name = specs_[i].name + suffix;
    auto it = std::find_if(tensors.begin(), tensors.end(),
                           [&](const HostTensor& t) { return t.name == name; });
    PS_RETURN_IF_ERROR(
        device_->CopyFromHost(dst + param_offsets_[i], it->bytes.data(), it->bytes.size()));
  }
  return absl::OkStatus();
}

}  // namespace pipesched::model
