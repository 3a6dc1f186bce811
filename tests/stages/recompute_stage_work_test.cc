// RecomputeStageWork's own contract, outside the executor: what it reports, and the
// misuse it refuses with a sentence instead of reading a stash that is not there. (Its
// numbers and memory inside a pipeline: contract_test.cc.)
#include "pipesched/stages/recompute_stage_work.h"

#include <memory>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "pipesched/base/status.h"
#include "pipesched/model/chunk.h"
#include "pipesched/runtime/runtime.h"
#include "pipesched/stages/mlp_stage_work.h"
#include "stages/toy_stage_work.h"
#include "testing/status_matchers.h"

namespace pipesched::stages {
namespace {

using ::pipesched::testing::StatusIs;
using ::testing::HasSubstr;

class RecomputeStageWorkTest : public ::testing::Test {
 protected:
  void SetUp() override {
    PS_ASSERT_OK_AND_ASSIGN(
        backend_, runtime::CreateBackend(
                      {.kind = runtime::BackendKind::kHost, .num_devices = 1, .strict = true}));
    PS_ASSERT_OK_AND_ASSIGN(stream_, backend_->device(0).CreateStream("compute"));
  }
  // Layers [0, 2) of a 3-layer MLP: 6 inputs, hidden 8.
  absl::StatusOr<std::unique_ptr<StageWork>> Mlp() {
    model::ChunkOptions options{
        .config = {.d_in = 6, .d_hidden = 8, .num_classes = 4, .num_layers = 3},
        .first_layer = 0,
        .last_layer = 2,
        .seed = 3};
    PS_ASSIGN_OR_RETURN(std::unique_ptr<MlpStageWork> work,
                        MlpStageWork::Create(options, 2, backend_->device(0)));
    return std::unique_ptr<StageWork>(std::move(work));
  }
  std::unique_ptr<runtime::Backend> backend_;
  std::unique_ptr<runtime::Stream> stream_;
};

TEST_F(RecomputeStageWorkTest, KeepsNothingFromFAndRebuildsTheWrappedStash) {
  PS_ASSERT_OK_AND_ASSIGN(std::unique_ptr<StageWork> mlp, Mlp());
  const std::int64_t stash = mlp->stash_bytes();
  const std::int64_t workspace = mlp->workspace_bytes();
  ASSERT_GT(stash, 0);
  PS_ASSERT_OK_AND_ASSIGN(auto rc, RecomputeStageWork::Create(std::move(mlp)));
  EXPECT_EQ(rc->stash_bytes(), 0);
  EXPECT_EQ(rc->recompute_bytes(), stash);
  EXPECT_EQ(rc->workspace_bytes(), workspace);
  EXPECT_EQ(rc->input_bytes(), 2 * 6 * sizeof(float));
  EXPECT_EQ(rc->output_bytes(), 2 * 8 * sizeof(float));
}

TEST_F(RecomputeStageWorkTest, RefusesNothingToWrapAndWrappingTwice) {
  EXPECT_THAT(RecomputeStageWork::Create(nullptr),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("recomputation needs a stage's work to wrap, got none")));
  PS_ASSERT_OK_AND_ASSIGN(std::unique_ptr<StageWork> mlp, Mlp());
  PS_ASSERT_OK_AND_ASSIGN(std::unique_ptr<StageWork> once,
                          RecomputeStageWork::Create(std::move(mlp)));
  EXPECT_THAT(RecomputeStageWork::Create(std::move(once)),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("recomputes its activations already")));
  // A stage whose stash is empty rebuilds nothing, but still runs its F again: it
  // recomputes all the same, so wrapping it twice is refused too.
  auto empty = std::make_unique<testing::ToyStage>(0, 1, testing::ToyOptions{.stash_bytes = 0},
                                                   backend_->device(0));
  EXPECT_FALSE(empty->recomputes());
  PS_ASSERT_OK_AND_ASSIGN(std::unique_ptr<StageWork> wrapped,
                          RecomputeStageWork::Create(std::move(empty)));
  EXPECT_EQ(wrapped->recompute_bytes(), 0);
  EXPECT_TRUE(wrapped->recomputes());
  EXPECT_THAT(RecomputeStageWork::Create(std::move(wrapped)),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("recomputes its activations already")));
}

// W before its I, and a second I, would read a stash that is not there (or overwrite
// one): refused while enqueueing.
TEST_F(RecomputeStageWorkTest, RefusesWBeforeIAndABackwardTwice) {
  PS_ASSERT_OK_AND_ASSIGN(std::unique_ptr<StageWork> mlp, Mlp());
  PS_ASSERT_OK_AND_ASSIGN(auto rc, RecomputeStageWork::Create(std::move(mlp)));
  runtime::Device& device = backend_->device(0);
  const std::int64_t parameters = device.memory_stats().current_bytes;
  PS_ASSERT_OK_AND_ASSIGN(runtime::Buffer x, device.Allocate(rc->input_bytes(), *stream_));
  PS_ASSERT_OK_AND_ASSIGN(runtime::Buffer y, device.Allocate(rc->output_bytes(), *stream_));
  PS_ASSERT_OK_AND_ASSIGN(runtime::Buffer dy, device.Allocate(rc->output_bytes(), *stream_));
  PS_ASSERT_OK_AND_ASSIGN(runtime::Buffer dx, device.Allocate(rc->input_bytes(), *stream_));
  std::vector<float> ones(rc->output_bytes() / sizeof(float), 0.5f);
  PS_ASSERT_OK(stream_->EnqueueHost([&x, &dy, &ones] {
    std::fill(x.as<float>(), x.as<float>() + 12, 0.25f);
    std::copy(ones.begin(), ones.end(), dy.as<float>());
    return absl::OkStatus();
  }));
  PS_ASSERT_OK_AND_ASSIGN(std::unique_ptr<ActivationStash> stash, rc->AllocateStash(*stream_));
  EXPECT_EQ(stash->bytes(), 0);
  MicrobatchIO io{.input = x.data(),
                  .output = y.data(),
                  .grad_output = dy.as<float>(),
                  .grad_input = dx.data(),
                  .stash = stash.get()};
  PS_ASSERT_OK(rc->Forward(io, *stream_));
  // (So that the F's stash is freed before the I allocates again: the runtime counts an
  // allocation when issued, a free when reached.)
  PS_ASSERT_OK(stream_->Synchronize());
  EXPECT_THAT(rc->BackwardWeight(io, *stream_),
              StatusIs(absl::StatusCode::kFailedPrecondition,
                       HasSubstr("W of a micro-batch whose I did not run")));
  PS_ASSERT_OK(rc->BackwardInput(io, *stream_));
  EXPECT_THAT(rc->BackwardInput(io, *stream_),
              StatusIs(absl::StatusCode::kFailedPrecondition,
                       HasSubstr("the micro-batch's backward ran already since its F")));
  PS_ASSERT_OK(rc->BackwardWeight(io, *stream_));
  PS_ASSERT_OK(stash->FreeAsync(*stream_));
  for (runtime::Buffer* b : {&x, &y, &dy, &dx}) PS_ASSERT_OK(b->FreeAsync(*stream_));
  PS_ASSERT_OK(stream_->Synchronize());
  // Everything it rebuilt was freed; it held the wrapped stash, and the workspace, at most.
  EXPECT_EQ(device.memory_stats().current_bytes, parameters);
  EXPECT_LE(device.memory_stats().peak_bytes, parameters +
                                                  2 * (rc->input_bytes() + rc->output_bytes()) +
                                                  rc->recompute_bytes() + rc->workspace_bytes());
}

}  // namespace
}  // namespace pipesched::stages
