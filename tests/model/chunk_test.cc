// Chunk on the host backend: gradients against finite differences of a double-precision
// reference, I then W equals B, accumulation over micro-batches equals one big batch,
// partitioning does not change the math, optimizers, export/import, errors.
#include "pipesched/model/chunk.h"

#include <cmath>
#include <limits>
#include <map>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "model_test_util.h"
#include "pipesched/model/reference.h"
#include "pipesched/model/synthetic.h"
#include "pipesched/runtime/runtime.h"
#include "testing/status_matchers.h"

namespace pipesched::model {
namespace {

using pipesched::testing::StatusIs;
using testing::AllClose;
using ::testing::HasSubstr;
using testing::RandomFloats;
using testing::RandomLabels;

using ParamMap = std::map<std::string, std::vector<double>>;

ParamMap ToMap(const std::vector<HostTensor>& tensors) {
  ParamMap map;
  for (const HostTensor& t : tensors) {
    std::vector<float> f = *t.ToFloats();
    map[t.name] = std::vector<double>(f.begin(), f.end());
  }
  return map;
}

std::vector<float> Flatten(const std::vector<HostTensor>& tensors) {
  std::vector<float> out;
  for (const HostTensor& t : tensors) {
    std::vector<float> f = *t.ToFloats();
    out.insert(out.end(), f.begin(), f.end());
  }
  return out;
}

// The model of model/mlp.h written out naively in double: mean cross-entropy.
double ReferenceLoss(const MlpConfig& config, const ParamMap& p, const std::vector<float>& x,
                     const std::vector<std::int32_t>& labels) {
  const int batch = static_cast<int>(labels.size());
  double total = 0.0;
  for (int s = 0; s < batch; ++s) {
    std::vector<double> h(x.begin() + s * config.d_in, x.begin() + (s + 1) * config.d_in);
    for (int layer = 0; layer <= config.num_layers; ++layer) {
      LayerShape shape = LayerAt(config, layer);
      const std::vector<double>& w = p.at(shape.name + ".weight");
      const std::vector<double>& b = p.at(shape.name + ".bias");
      std::vector<double> out(shape.out);
      for (int o = 0; o < shape.out; ++o) {
        double z = b[o];
        for (int i = 0; i < shape.in; ++i) z += w[o * shape.in + i] * h[i];
        if (shape.gelu) z = 0.5 * z * (1.0 + std::erf(z / std::sqrt(2.0)));
        out[o] = z + (shape.residual ? h[o] : 0.0);
      }
      h = out;
    }
    double mx = h[0];
    for (double v : h) mx = std::max(mx, v);
    double sum = 0.0;
    for (double v : h) sum += std::exp(v - mx);
    total += mx + std::log(sum) - h[labels[s]];
  }
  return total / batch;
}

class ChunkTest : public ::testing::Test {
 protected:
  void SetUp() override {
    runtime::BackendOptions options;
    options.kind = runtime::BackendKind::kHost;
    options.num_devices = 2;
    options.strict = true;
    auto backend = runtime::CreateBackend(options);
    ASSERT_TRUE(backend.ok()) << backend.status();
    backend_ = std::move(*backend);
    for (int d = 0; d < 2; ++d) {
      auto stream = backend_->device(d).CreateStream("compute");
      ASSERT_TRUE(stream.ok()) << stream.status();
      streams_.push_back(std::move(*stream));
    }
  }

  runtime::Device& device(int d) { return backend_->device(d); }
  runtime::Stream& stream(int d) { return *streams_[d]; }

  std::unique_ptr<Chunk> MakeChunk(const MlpConfig& config, int first, int last, int dev = 0,
                                   OptimizerConfig opt = {}) {
    ChunkOptions options;
    options.config = config;
    options.first_layer = first;
    options.last_layer = last;
    options.seed = 42;
    options.optimizer = opt;
    auto chunk = Chunk::Create(options, device(dev));
    EXPECT_TRUE(chunk.ok()) << chunk.status();
    return chunk.ok() ? std::move(*chunk) : nullptr;
  }

  // Host backend: device pointers are host pointers; keep the bytes in host vectors.
  struct Step {
    float loss = 0;
    std::vector<float> dx;
  };
  // F, loss, B of one micro-batch through one whole-model chunk.
  Step RunMicrobatch(Chunk& chunk, const std::vector<float>& x,
                     const std::vector<std::int32_t>& labels, float grad_scale,
                     bool split_backward = false) {
    const int batch = static_cast<int>(labels.size());
    runtime::Stream& s = stream(0);
    std::vector<float> logits(batch * chunk.out_features());
    Step out;
    out.dx.assign(x.size(), NAN);
    auto stash = chunk.AllocateStash(batch, s);
    EXPECT_TRUE(stash.ok()) << stash.status();
    PS_EXPECT_OK(chunk.Forward(x.data(), *stash, logits.data(), s));
    PS_EXPECT_OK(
        chunk.Loss(logits.data(), labels.data(), batch, grad_scale, &out.loss, logits.data(), s));
    if (split_backward) {
      PS_EXPECT_OK(chunk.BackwardInput(logits.data(), *stash, out.dx.data(), s));
      PS_EXPECT_OK(chunk.BackwardWeight(*stash, s));
    } else {
      PS_EXPECT_OK(chunk.Backward(logits.data(), *stash, out.dx.data(), s));
    }
    PS_EXPECT_OK(stash->FreeAsync(s));
    PS_EXPECT_OK(s.Synchronize());
    return out;
  }

  std::unique_ptr<runtime::Backend> backend_;
  std::vector<std::unique_ptr<runtime::Stream>> streams_;
};

TEST_F(ChunkTest, GradientsMatchFiniteDifferencesOfDoubleReference) {
  for (MlpConfig config : {MlpConfig{5, 7, 4, 3}, MlpConfig{6, 6, 3, 2}}) {
    SCOPED_TRACE(absl::StrCat("d_in ", config.d_in, " d_hidden ", config.d_hidden));
    const int batch = 6;
    auto chunk = MakeChunk(config, 0, config.num_model_layers());
    ASSERT_NE(chunk, nullptr);
    std::vector<float> x = RandomFloats(batch * config.d_in, 20);
    std::vector<std::int32_t> labels = RandomLabels(batch, config.num_classes, 21);
    Step step = RunMicrobatch(*chunk, x, labels, 1.0f);
    auto params = chunk->ExportParameters();
    ASSERT_TRUE(params.ok()) << params.status();
    ParamMap p = ToMap(*params);
    EXPECT_NEAR(step.loss, ReferenceLoss(config, p, x, labels), 1e-5);

    auto grads = chunk->ExportGradients();
    ASSERT_TRUE(grads.ok()) << grads.status();
    for (const HostTensor& g : *grads) {
      std::vector<float> got = *g.ToFloats();
      std::vector<double> want(got.size());
      for (std::size_t i = 0; i < got.size(); ++i) {
        const double eps = 1e-5;
        ParamMap plus = p, minus = p;
        plus[g.name][i] += eps;
        minus[g.name][i] -= eps;
        want[i] =
            (ReferenceLoss(config, plus, x, labels) - ReferenceLoss(config, minus, x, labels)) /
            (2 * eps);
      }
      EXPECT_TRUE(AllClose(g.name, got, want, 2e-5, 1e-3));
    }
    // dx against finite differences in x.
    std::vector<double> want_dx(x.size());
    for (std::size_t i = 0; i < x.size(); ++i) {
      std::vector<float> xp = x, xm = x;
      const float eps = 1e-2f;
      xp[i] += eps;
      xm[i] -= eps;
      want_dx[i] = (ReferenceLoss(config, p, xp, labels) - ReferenceLoss(config, p, xm, labels)) /
                   (double(xp[i]) - double(xm[i]));
    }
    EXPECT_TRUE(AllClose("dx", step.dx, want_dx, 1e-4, 1e-2));
  }
}

TEST_F(ChunkTest, BackwardInputThenWeightEqualsBackward) {
  const MlpConfig config{8, 16, 5, 3};
  auto a = MakeChunk(config, 0, config.num_model_layers());
  auto b = MakeChunk(config, 0, config.num_model_layers());
  std::vector<float> x = RandomFloats(10 * config.d_in, 22);
  std::vector<std::int32_t> labels = RandomLabels(10, config.num_classes, 23);
  Step sa = RunMicrobatch(*a, x, labels, 1.0f, /*split_backward=*/false);
  Step sb = RunMicrobatch(*b, x, labels, 1.0f, /*split_backward=*/true);
  EXPECT_EQ(sa.loss, sb.loss);
  EXPECT_TRUE(AllClose("dx", sb.dx, sa.dx, 0, 0));
  EXPECT_TRUE(
      AllClose("grads", Flatten(*b->ExportGradients()), Flatten(*a->ExportGradients()), 0, 0));
}

// M micro-batches with grad_scale 1/M accumulate the gradient of the global batch's mean
// loss; W delayed past other micro-batches' F and I (as zero-bubble schedules do) too.
TEST_F(ChunkTest, AccumulationOverMicrobatchesEqualsOneBigBatch) {
  const MlpConfig config{8, 16, 5, 3};
  const int m = 3, mb = 4;
  std::vector<float> x = RandomFloats(m * mb * config.d_in, 24);
  std::vector<std::int32_t> labels = RandomLabels(m * mb, config.num_classes, 25);
  auto big = MakeChunk(config, 0, config.num_model_layers());
  Step whole = RunMicrobatch(*big, x, labels, 1.0f);

  auto acc = MakeChunk(config, 0, config.num_model_layers());
  runtime::Stream& s = stream(0);
  std::vector<Stash> stashes;
  std::vector<std::vector<float>> logits(m, std::vector<float>(mb * config.num_classes));
  std::vector<float> losses(m);
  for (int i = 0; i < m; ++i) {
    auto stash = acc->AllocateStash(mb, s);
    ASSERT_TRUE(stash.ok()) << stash.status();
    stashes.push_back(std::move(*stash));
    PS_ASSERT_OK(acc->Forward(x.data() + i * mb * config.d_in, stashes[i], logits[i].data(), s));
    PS_ASSERT_OK(acc->Loss(logits[i].data(), labels.data() + i * mb, mb, 1.0f / m, &losses[i],
                           logits[i].data(), s));
    PS_ASSERT_OK(acc->BackwardInput(logits[i].data(), stashes[i], nullptr, s));
  }
  for (int i = m - 1; i >= 0; --i) PS_ASSERT_OK(acc->BackwardWeight(stashes[i], s));
  PS_ASSERT_OK(s.Synchronize());
  EXPECT_NEAR((losses[0] + losses[1] + losses[2]) / m, whole.loss, 1e-6);
  EXPECT_TRUE(AllClose("accumulated grads", Flatten(*acc->ExportGradients()),
                       Flatten(*big->ExportGradients()), 1e-6, 1e-5));
}

// Chunks [0, 2) on device 0 and [2, L+1) on device 1 compute what one chunk computes.
TEST_F(ChunkTest, PartitionedChunksMatchTheWholeModel) {
  const MlpConfig config{8, 16, 5, 3};
  const int batch = 7;
  std::vector<float> x = RandomFloats(batch * config.d_in, 26);
  std::vector<std::int32_t> labels = RandomLabels(batch, config.num_classes, 27);
  auto whole = MakeChunk(config, 0, config.num_model_layers());
  Step ref = RunMicrobatch(*whole, x, labels, 1.0f);

  auto c0 = MakeChunk(config, 0, 2, 0);
  auto c1 = MakeChunk(config, 2, config.num_model_layers(), 1);
  EXPECT_EQ(c0->out_features(), config.d_hidden);
  EXPECT_EQ(c1->in_features(), config.d_hidden);
  EXPECT_TRUE(c1->has_head());
  EXPECT_FALSE(c0->has_head());
  std::vector<float> h(batch * config.d_hidden), logits(batch * config.num_classes),
      dh(batch * config.d_hidden), dx(x.size());
  float loss = 0;
  auto s0 = c0->AllocateStash(batch, stream(0));
  auto s1 = c1->AllocateStash(batch, stream(1));
  ASSERT_TRUE(s0.ok() && s1.ok());
  PS_ASSERT_OK(c0->Forward(x.data(), *s0, h.data(), stream(0)));
  PS_ASSERT_OK(stream(0).Synchronize());
  PS_ASSERT_OK(c1->Forward(h.data(), *s1, logits.data(), stream(1)));
  PS_ASSERT_OK(
      c1->Loss(logits.data(), labels.data(), batch, 1.0f, &loss, logits.data(), stream(1)));
  PS_ASSERT_OK(c1->Backward(logits.data(), *s1, dh.data(), stream(1)));
  PS_ASSERT_OK(stream(1).Synchronize());
  PS_ASSERT_OK(c0->Backward(dh.data(), *s0, dx.data(), stream(0)));
  PS_ASSERT_OK(stream(0).Synchronize());

  EXPECT_EQ(loss, ref.loss);
  EXPECT_TRUE(AllClose("dx", dx, ref.dx, 1e-7, 1e-6));
  std::vector<HostTensor> parts = *c0->ExportGradients();
  std::vector<HostTensor> parts1 = *c1->ExportGradients();
  parts.insert(parts.end(), parts1.begin(), parts1.end());
  EXPECT_TRUE(AllClose("grads", Flatten(parts), Flatten(*whole->ExportGradients()), 1e-7, 1e-6));
  std::vector<HostTensor> params = *c0->ExportParameters();
  std::vector<HostTensor> params1 = *c1->ExportParameters();
  params.insert(params.end(), params1.begin(), params1.end());
  EXPECT_TRUE(AllClose("init", Flatten(params), Flatten(*whole->ExportParameters()), 0, 0));
}

TEST_F(ChunkTest, ActivationBytesAndStashSize) {
  const MlpConfig config{5, 7, 4, 3};
  // block 0: 5 + 7, blocks 1-2: 7 + 7 each, head: 7 + 4 -> 51 floats.
  EXPECT_EQ(ActivationBytesPerSample(config, 0, 4), 51 * 4);
  EXPECT_EQ(ActivationBytesPerSample(config, 3, 4), 11 * 4);
  auto chunk = MakeChunk(config, 1, 3);
  EXPECT_EQ(chunk->activation_bytes_per_sample(), 28 * 4);
  const std::int64_t before = device(0).memory_stats().current_bytes;
  auto stash = chunk->AllocateStash(9, stream(0));
  ASSERT_TRUE(stash.ok()) << stash.status();
  EXPECT_EQ(stash->bytes(), 9u * 28 * 4);
  PS_ASSERT_OK(stream(0).Synchronize());
  EXPECT_EQ(device(0).memory_stats().current_bytes - before, 9 * 28 * 4);
}

TEST_F(ChunkTest, ParameterNamesShapesAndInitBounds) {
  const MlpConfig config{5, 7, 4, 2};
  auto chunk = MakeChunk(config, 0, 3);
  auto params = chunk->ExportParameters();
  ASSERT_TRUE(params.ok());
  std::vector<std::string> names;
  for (const HostTensor& t : *params) {
    names.push_back(t.name);
    const double bound = 1.0 / std::sqrt(t.name.starts_with("blocks.0") ? 5.0 : 7.0);
    std::vector<float> values = *t.ToFloats();
    for (float v : values) {
      EXPECT_LE(std::fabs(v), bound) << t.name;
    }
  }
  EXPECT_THAT(names, ::testing::ElementsAre("blocks.0.weight", "blocks.0.bias", "blocks.1.weight",
                                            "blocks.1.bias", "head.weight", "head.bias"));
  EXPECT_EQ((*params)[0].shape, (std::vector<std::int64_t>{7, 5}));
  EXPECT_EQ((*params)[4].shape, (std::vector<std::int64_t>{4, 7}));
  EXPECT_EQ((*params)[5].shape, (std::vector<std::int64_t>{4}));
}

// Parameters are initialised through a host buffer of 2^20 floats: a weight of
// 1100 x 1100 = 1.21 M floats takes two pieces, which together equal InitParameter of the
// whole tensor; gradients and optimizer state start at zero.
TEST_F(ChunkTest, InitialisationInPiecesEqualsTheWholeTensor) {
  const MlpConfig config{3, 1100, 2, 2};
  auto chunk = MakeChunk(config, 1, 3, 0, OptimizerConfig{.kind = OptimizerKind::kAdamW});
  ASSERT_NE(chunk, nullptr);
  PS_ASSERT_OK_AND_ASSIGN(std::vector<HostTensor> params, chunk->ExportParameters());
  ASSERT_EQ(params.size(), chunk->param_specs().size());
  for (std::size_t i = 0; i < params.size(); ++i) {
    const ParamSpec& spec = chunk->param_specs()[i];
    std::vector<float> want(spec.numel());
    InitParameter(config, 42, spec, want.data());
    PS_ASSERT_OK_AND_ASSIGN(std::vector<float> got, params[i].ToFloats());
    EXPECT_EQ(got, want) << spec.name;
  }
  EXPECT_GT(chunk->param_specs()[0].numel(), std::int64_t{1} << 20);
  PS_ASSERT_OK_AND_ASSIGN(std::vector<HostTensor> grads, chunk->ExportGradients());
  PS_ASSERT_OK_AND_ASSIGN(std::vector<HostTensor> state, chunk->ExportOptimizerState());
  ASSERT_EQ(state.size(), 2 * params.size());
  for (const std::vector<HostTensor>* ts : {&grads, &state}) {
    for (const HostTensor& t : *ts) {
      PS_ASSERT_OK_AND_ASSIGN(std::vector<float> v, t.ToFloats());
      EXPECT_EQ(v, std::vector<float>(v.size(), 0.0f)) << t.name;
    }
  }
}

// Parameters, gradients and the optimizer's buffers, fp32: what a chunk holds for its
// life (train's memory line, the Trainer's host-memory check).
TEST_F(ChunkTest, StateBytesCountTheOptimizersBuffers) {
  const MlpConfig config{5, 7, 4, 2};
  const std::int64_t n = (5 * 7 + 7) + (7 * 7 + 7) + (7 * 4 + 4);
  OptimizerConfig plain;
  plain.sgd.momentum = 0;
  OptimizerConfig momentum;
  momentum.sgd.momentum = 0.9f;
  const OptimizerConfig adamw{.kind = OptimizerKind::kAdamW};
  EXPECT_EQ(OptimizerStateBuffers(plain), 0);
  EXPECT_EQ(OptimizerStateBuffers(momentum), 1);
  EXPECT_EQ(OptimizerStateBuffers(adamw), 2);
  EXPECT_EQ(MakeChunk(config, 0, 3, 0, plain)->state_bytes(), n * 2 * 4);
  EXPECT_EQ(MakeChunk(config, 0, 3, 0, momentum)->state_bytes(), n * 3 * 4);
  EXPECT_EQ(MakeChunk(config, 0, 3, 0, adamw)->state_bytes(), n * 4 * 4);
}

TEST_F(ChunkTest, SgdAndAdamWStepsUseAccumulatedGradients) {
  const MlpConfig config{4, 6, 3, 2};
  for (OptimizerKind kind : {OptimizerKind::kSgd, OptimizerKind::kAdamW}) {
    OptimizerConfig opt;
    opt.kind = kind;
    opt.sgd = {0.1f, 0.0f, 0.0f};
    opt.adamw = {0.01f, 0.9f, 0.999f, 1e-8f, 0.0f};
    auto chunk = MakeChunk(config, 0, 3, 0, opt);
    std::vector<float> x = RandomFloats(5 * config.d_in, 28);
    std::vector<std::int32_t> labels = RandomLabels(5, config.num_classes, 29);
    RunMicrobatch(*chunk, x, labels, 1.0f);
    std::vector<float> p0 = Flatten(*chunk->ExportParameters());
    std::vector<float> g = Flatten(*chunk->ExportGradients());
    PS_ASSERT_OK(chunk->Step(stream(0)));
    PS_ASSERT_OK(stream(0).Synchronize());
    std::vector<float> p1 = Flatten(*chunk->ExportParameters());
    std::vector<double> want(p0.size());
    for (std::size_t i = 0; i < p0.size(); ++i) {
      // AdamW's first step moves each parameter by lr * sign(g) (up to eps).
      want[i] = kind == OptimizerKind::kSgd
                    ? p0[i] - 0.1 * g[i]
                    : p0[i] - 0.01 * g[i] / (std::fabs(double(g[i])) + 1e-8);
    }
    EXPECT_TRUE(AllClose(std::string(OptimizerName(kind)), p1, want, 1e-6, 1e-5));
    PS_ASSERT_OK(chunk->ZeroGrad(stream(0)));
    PS_ASSERT_OK(stream(0).Synchronize());
    EXPECT_TRUE(AllClose("zeroed", Flatten(*chunk->ExportGradients()),
                         std::vector<double>(g.size()), 0, 0));
    EXPECT_EQ(chunk->step_count(), 1);
  }
}

TEST_F(ChunkTest, ImportExportRoundTripAndErrors) {
  const MlpConfig config{4, 6, 3, 2};
  auto a = MakeChunk(config, 1, 3);
  ChunkOptions other;
  other.config = config;
  other.first_layer = 0;
  other.last_layer = 3;
  other.seed = 7;
  auto b = Chunk::Create(other, device(0));
  ASSERT_TRUE(b.ok());
  // A whole-model export loads into a partial chunk; extra tensors are ignored.
  PS_ASSERT_OK(a->ImportParameters(*(*b)->ExportParameters()));
  std::vector<HostTensor> got = *a->ExportParameters();
  std::vector<HostTensor> all = *(*b)->ExportParameters();
  EXPECT_TRUE(AllClose("imported", Flatten(got),
                       Flatten(std::vector<HostTensor>(all.begin() + 2, all.end())), 0, 0));

  std::vector<HostTensor> missing(all.begin(), all.begin() + 3);
  EXPECT_THAT(a->ImportParameters(missing),
              StatusIs(absl::StatusCode::kNotFound, HasSubstr("'blocks.1.bias' (6) is missing")));
  std::vector<HostTensor> wrong = all;
  wrong[2] = HostTensor::F32("blocks.1.weight", {3, 12}, std::vector<float>(36));
  EXPECT_THAT(a->ImportParameters(wrong),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("'blocks.1.weight' has shape (3, 12), expected (6, 6)")));
  wrong[2] = HostTensor::I32("blocks.1.weight", {6, 6}, std::vector<std::int32_t>(36));
  EXPECT_THAT(a->ImportParameters(wrong),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("dtype I32, expected F32")));
  wrong[2] = HostTensor::F32("blocks.1.weight", {6, 6}, std::vector<float>(35));
  EXPECT_THAT(a->ImportParameters(wrong),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("'blocks.1.weight' holds 140 bytes, but F32 (6, 6) needs 144")));
  // Values that are not finite are refused when loaded, not found as a NaN loss later.
  std::vector<float> values(36, 0.25f);
  values[13] = std::numeric_limits<float>::infinity();
  wrong[2] = HostTensor::F32("blocks.1.weight", {6, 6}, values);
  EXPECT_THAT(a->ImportParameters(wrong),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("parameter 'blocks.1.weight' holds inf at element 13: every "
                                 "value must be finite")));
  values[13] = std::nanf("");
  wrong[2] = HostTensor::F32("blocks.1.weight", {6, 6}, values);
  EXPECT_THAT(a->ImportParameters(wrong),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("holds nan at element 13")));
}

TEST_F(ChunkTest, ImportedOptimizerStateMustBeUsable) {
  const MlpConfig config{4, 6, 3, 2};
  ChunkOptions options;
  options.config = config;
  options.first_layer = 0;
  options.last_layer = 3;
  options.optimizer.kind = OptimizerKind::kAdamW;
  PS_ASSERT_OK_AND_ASSIGN(std::unique_ptr<Chunk> chunk, Chunk::Create(options, device(0)));
  PS_ASSERT_OK_AND_ASSIGN(std::vector<HostTensor> state, chunk->ExportOptimizerState());
  PS_ASSERT_OK(chunk->ImportOptimizerState(state, 3));
  EXPECT_EQ(chunk->step_count(), 3);
  // A negative second moment would make every AdamW update NaN (its square root).
  for (HostTensor& t : state) {
    if (t.name != "head.bias.exp_avg_sq") continue;
    std::vector<float> values(t.bytes.size() / sizeof(float), 0.5f);
    values[1] = -1.0f;
    t = HostTensor::F32(t.name, t.shape, values);
  }
  EXPECT_THAT(chunk->ImportOptimizerState(state, 3),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("parameter 'head.bias.exp_avg_sq' holds -1 at element 1: a "
                                 "second moment must be finite and >= 0")));
}

TEST_F(ChunkTest, Errors) {
  const MlpConfig config{4, 6, 3, 2};
  ChunkOptions options;
  options.config = config;
  options.first_layer = 2;
  options.last_layer = 5;
  EXPECT_THAT(Chunk::Create(options, device(0)),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("layer range [2, 5)")));
  options.config.d_hidden = 0;
  EXPECT_THAT(Chunk::Create(options, device(0)),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("d_hidden must be in [1, 65536], got 0")));
  // Sizes whose products would overflow are refused, not computed with.
  options.config.d_hidden = 1 << 30;
  EXPECT_THAT(Chunk::Create(options, device(0)),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("d_hidden must be in [1, 65536], got 1073741824")));
  auto chunk = MakeChunk(config, 0, 2);
  EXPECT_THAT(chunk->AllocateStash(0, stream(0)),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("at least 1")));
  float loss;
  EXPECT_THAT(chunk->Loss(nullptr, nullptr, 1, 1.0f, &loss, nullptr, stream(0)),
              StatusIs(absl::StatusCode::kFailedPrecondition, HasSubstr("does not hold the head")));
  // A bad label poisons the stream with a message naming it.
  auto head = MakeChunk(config, 2, 3);
  std::vector<float> logits(2 * 3, 0.5f);
  std::vector<std::int32_t> labels = {1, 7};
  PS_ASSERT_OK(head->Loss(logits.data(), labels.data(), 2, 1.0f, &loss, logits.data(), stream(0)));
  EXPECT_THAT(stream(0).Synchronize(),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("label 7 of sample 1")));
}

TEST(ReferenceTrainerTest, LossDecreasesOnSyntheticData) {
  SyntheticConfig data_config;
  data_config.d_in = 16;
  data_config.num_classes = 4;
  data_config.num_samples = 256;
  data_config.seed = 3;
  auto data = MakeSynthetic(data_config);
  ASSERT_TRUE(data.ok());
  for (OptimizerKind kind : {OptimizerKind::kSgd, OptimizerKind::kAdamW}) {
    ReferenceOptions options;
    options.config = MlpConfig{16, 32, 4, 2};
    options.seed = 1;
    options.optimizer.kind = kind;
    options.optimizer.sgd = {0.1f, 0.9f, 0.0f};
    options.optimizer.adamw = {3e-3f, 0.9f, 0.999f, 1e-8f, 0.01f};
    options.num_microbatches = 4;
    auto trainer = ReferenceTrainer::Create(options);
    ASSERT_TRUE(trainer.ok()) << trainer.status();
    float first = 0, last = 0;
    for (int step = 0; step < 40; ++step) {
      const int offset = (step % 4) * 64;
      auto loss = (*trainer)->Step(data->x.data() + offset * 16, data->y.data() + offset, 64);
      ASSERT_TRUE(loss.ok()) << loss.status();
      if (step < 4) first += *loss / 4;
      if (step >= 36) last += *loss / 4;
    }
    EXPECT_LT(last, 0.6f * first) << OptimizerName(kind) << ": first " << first << " last " << last;
  }
}

TEST(ReferenceTrainerTest, RejectsBatchNotDivisibleByMicrobatches) {
  ReferenceOptions options;
  options.config = MlpConfig{4, 6, 3, 2};
  options.num_microbatches = 3;
  auto trainer = ReferenceTrainer::Create(options);
  ASSERT_TRUE(trainer.ok()) << trainer.status();
  std::vector<float> x(8 * 4);
  std::vector<std::int32_t> y(8);
  EXPECT_THAT((*trainer)->Step(x.data(), y.data(), 8),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("multiple of the 3")));
}

}  // namespace
}  // namespace pipesched::model
