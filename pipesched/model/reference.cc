// The single-device reference trainer: deliberately plain and synchronous.
#include "pipesched/model/reference.h"

#include "absl/strings/str_cat.h"
#include "pipesched/base/status.h"
#include "pipesched/model/math.h"

namespace pipesched::model {

ReferenceTrainer::~ReferenceTrainer() = default;

absl::StatusOr<std::unique_ptr<ReferenceTrainer>> ReferenceTrainer::Create(
    const ReferenceOptions& options) {
  if (options.num_microbatches < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("number of micro-batches must be at least 1, got ", options.num_microbatches));
  }
  std::unique_ptr<ReferenceTrainer> t(new ReferenceTrainer());
  t->options_ = options;
  runtime::BackendOptions backend_options;
  backend_options.kind = runtime::BackendKind::kHost;
  backend_options.num_devices = 1;
  backend_options.strict = true;
  PS_ASSIGN_OR_RETURN(t->backend_, runtime::CreateBackend(backend_options));
  runtime::Device& device = t->backend_->device(0);
  PS_ASSIGN_OR_RETURN(t->stream_, device.CreateStream("reference"));
  PS_RETURN_IF_ERROR(PrepareMath(device.kind(), 1));
  ChunkOptions chunk_options;
  chunk_options.config = options.config;
  chunk_options.first_layer = 0;
  chunk_options.last_layer = options.config.num_model_layers();
  chunk_options.seed = options.seed;
  chunk_options.optimizer = options.optimizer;
  PS_ASSIGN_OR_RETURN(t->chunk_, Chunk::Create(chunk_options, device));
  return t;
}

absl::StatusOr<float> ReferenceTrainer::Step(const float* x, const std::int32_t* labels,
                                             int batch) {
  const int m = options_.num_microbatches;
  if (batch < m || batch % m != 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "global batch ", batch, " is not a positive multiple of the ", m, " micro-batches"));
  }
  const int mb = batch / m;
  const MlpConfig& config = options_.config;
  runtime::Device& device = chunk_->device();
  runtime::Stream& stream = *stream_;
  PS_ASSIGN_OR_RETURN(runtime::Buffer xb,
                      device.Allocate(sizeof(float) * mb * config.d_in, stream));
  PS_ASSIGN_OR_RETURN(runtime::Buffer yb, device.Allocate(sizeof(std::int32_t) * mb, stream));
  PS_ASSIGN_OR_RETURN(runtime::Buffer logits,
                      device.Allocate(sizeof(float) * mb * config.num_classes, stream));
  PS_ASSIGN_OR_RETURN(runtime::Buffer loss, device.Allocate(sizeof(float), stream));
  PS_RETURN_IF_ERROR(chunk_->ZeroGrad(stream));
  double total = 0.0;
  for (int i = 0; i < m; ++i) {
    PS_RETURN_IF_ERROR(stream.Synchronize());
    PS_RETURN_IF_ERROR(device.CopyFromHost(xb.data(),
                                           x + static_cast<std::int64_t>(i) * mb * config.d_in,
                                           sizeof(float) * mb * config.d_in));
    PS_RETURN_IF_ERROR(device.CopyFromHost(yb.data(), labels + static_cast<std::int64_t>(i) * mb,
                                           sizeof(std::int32_t) * mb));
    PS_ASSIGN_OR_RETURN(Stash stash, chunk_->AllocateStash(mb, stream));
    PS_RETURN_IF_ERROR(chunk_->Forward(xb.as<float>(), stash, logits.as<float>(), stream));
    PS_RETURN_IF_ERROR(chunk_->Loss(logits.as<float>(), yb.as<std::int32_t>(), mb, 1.0f / m,
                                    loss.as<float>(), logits.as<float>(), stream));
    PS_RETURN_IF_ERROR(chunk_->Backward(logits.as<float>(), stash, nullptr, stream));
    PS_RETURN_IF_ERROR(stash.FreeAsync(stream));
    PS_RETURN_IF_ERROR(stream.Synchronize());
    float l = 0.0f;
    PS_RETURN_IF_ERROR(device.CopyToHost(&l, loss.data(), sizeof(float)));
    total += l;
  }
  PS_RETURN_IF_ERROR(chunk_->Step(stream));
  for (runtime::Buffer* b : {&xb, &yb, &logits, &loss}) PS_RETURN_IF_ERROR(b->FreeAsync(stream));
  PS_RETURN_IF_ERROR(stream.Synchronize());
  return static_cast<float>(total / m);
}

absl::StatusOr<std::vector<HostTensor>> ReferenceTrainer::ExportParameters() const {
  return chunk_->ExportParameters();
}

}  // namespace pipesched::model
