// The MLP as a StageWork (stages/mlp_stage_work.h).
#include "pipesched/stages/mlp_stage_work.h"

#include <cstdint>

#include "absl/strings/str_cat.h"
#include "pipesched/base/status.h"

namespace pipesched::stages {
namespace {

// The chunk's stash plus, on the head chunk, the (B, classes) logits that become
// dlogits in F (the loss) and feed the head's backward.
class MlpStash final : public ActivationStash {
 public:
  model::Stash stash;
  runtime::Buffer logits;
  std::int64_t bytes() const override {
    return static_cast<std::int64_t>(stash.bytes() + logits.size());
  }
  absl::Status FreeAsync(runtime::Stream& stream) override {
    PS_RETURN_IF_ERROR(stash.FreeAsync(stream));
    return logits.FreeAsync(stream);
  }
};

MlpStash& Of(const MicrobatchIO& io) { return *static_cast<MlpStash*>(io.stash); }

}  // namespace

absl::StatusOr<std::unique_ptr<MlpStageWork>> MlpStageWork::Create(
    const model::ChunkOptions& options, int microbatch_size, runtime::Device& device) {
  if (microbatch_size < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("the micro-batch size must be at least 1, not ", microbatch_size));
  }
  PS_ASSIGN_OR_RETURN(std::unique_ptr<model::Chunk> chunk, model::Chunk::Create(options, device));
  return std::unique_ptr<MlpStageWork>(new MlpStageWork(std::move(chunk), microbatch_size));
}

std::size_t MlpStageWork::input_bytes() const {
  return sizeof(float) * static_cast<std::size_t>(batch_) * chunk_->in_features();
}

std::size_t MlpStageWork::output_bytes() const {
  return chunk_->has_head()
             ? 0
             : sizeof(float) * static_cast<std::size_t>(batch_) * chunk_->out_features();
}

std::size_t MlpStageWork::target_bytes() const {
  return chunk_->has_head() ? sizeof(std::int32_t) * static_cast<std::size_t>(batch_) : 0;
}

std::int64_t MlpStageWork::stash_bytes() const {
  std::int64_t bytes = static_cast<std::int64_t>(batch_) * chunk_->activation_bytes_per_sample();
  if (chunk_->has_head()) {
    bytes += static_cast<std::int64_t>(sizeof(float)) * batch_ * chunk_->out_features();
  }
  return bytes;
}

std::int64_t MlpStageWork::workspace_bytes() const {
  return chunk_->backward_workspace_bytes(batch_);
}

absl::StatusOr<std::unique_ptr<ActivationStash>> MlpStageWork::AllocateStash(
    runtime::Stream& stream) {
  auto stash = std::make_unique<MlpStash>();
  PS_ASSIGN_OR_RETURN(stash->stash, chunk_->AllocateStash(batch_, stream));
  if (chunk_->has_head()) {
    PS_ASSIGN_OR_RETURN(
        stash->logits,
        chunk_->device().Allocate(
            sizeof(float) * static_cast<std::size_t>(batch_) * chunk_->out_features(), stream));
  }
  return std::unique_ptr<ActivationStash>(std::move(stash));
}

absl::Status MlpStageWork::Forward(const MicrobatchIO& io, runtime::Stream& stream) {
  MlpStash& st = Of(io);
  const auto* x = static_cast<const float*>(io.input);
  if (!chunk_->has_head()) {
    return chunk_->Forward(x, st.stash, static_cast<float*>(io.output), stream);
  }
  float* logits = st.logits.as<float>();
  PS_RETURN_IF_ERROR(chunk_->Forward(x, st.stash, logits, stream));
  // dlogits overwrite the logits in place: the head's backward starts from them.
  return chunk_->Loss(logits, static_cast<const std::int32_t*>(io.targets), batch_, io.loss_scale,
                      io.loss, logits, stream);
}

absl::Status MlpStageWork::Backward(const MicrobatchIO& io, runtime::Stream& stream) {
  MlpStash& st = Of(io);
  const float* dy =
      chunk_->has_head() ? st.logits.as<float>() : static_cast<const float*>(io.grad_output);
  return chunk_->Backward(dy, st.stash, static_cast<float*>(io.grad_input), stream);
}

absl::Status MlpStageWork::BackwardInput(const MicrobatchIO& io, runtime::Stream& stream) {
  MlpStash& st = Of(io);
  const float* dy =
      chunk_->has_head() ? st.logits.as<float>() : static_cast<const float*>(io.grad_output);
  return chunk_->BackwardInput(dy, st.stash, static_cast<float*>(io.grad_input), stream);
}

absl::Status MlpStageWork::BackwardWeight(const MicrobatchIO& io, runtime::Stream& stream) {
  return chunk_->BackwardWeight(Of(io).stash, stream);
}

std::vector<GradientSpan> MlpStageWork::gradients() {
  return {GradientSpan{.data = chunk_->grads(),
                       .count = static_cast<std::size_t>(chunk_->num_params())}};
}

}  // namespace pipesched::stages
