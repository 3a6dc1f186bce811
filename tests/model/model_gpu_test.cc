// Every CUDA op of the model against the host implementation on the same random inputs
// (outputs poisoned first), and a CUDA Chunk training step against a host one. Labelled
// gpu; skips through PS_SKIP_IF_NO_GPU without a usable GPU.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <memory>
#include <vector>

#include "gtest/gtest.h"
#include "model_test_util.h"
#include "pipesched/model/chunk.h"
#include "pipesched/model/host_kernels.h"
#include "pipesched/model/math.h"
#include "pipesched/runtime/runtime.h"
#include "testing/gpu.h"
#include "testing/status_matchers.h"

namespace pipesched::model {
namespace {

using testing::AllClose;
using testing::Poisoned;
using testing::RandomFloats;
using testing::RandomLabels;

class ModelGpuTest : public ::testing::Test {
 protected:
  void SetUp() override {
    PS_SKIP_IF_NO_GPU();
    runtime::BackendOptions options;
    options.kind = runtime::BackendKind::kCuda;
    options.num_devices = 1;
    PS_ASSERT_OK_AND_ASSIGN(backend_, runtime::CreateBackend(options));
    PS_ASSERT_OK_AND_ASSIGN(stream_, device().CreateStream("model-gpu-test"));
    PS_ASSERT_OK_AND_ASSIGN(math_, CreateMath(device()));
  }
  void TearDown() override {
    if (stream_) {
      PS_EXPECT_OK(stream_->Synchronize());
    }
    buffers_.clear();
    math_.reset();
    stream_.reset();
  }

  runtime::Device& device() { return backend_->device(0); }

  // A device copy of `host`; kept alive until the test ends.
  template <typename T>
  T* Upload(const std::vector<T>& host) {
    absl::StatusOr<runtime::Buffer> b = device().Allocate(sizeof(T) * host.size(), *stream_);
    EXPECT_TRUE(b.ok()) << b.status();
    EXPECT_TRUE(stream_->Synchronize().ok());
    EXPECT_TRUE(device().CopyFromHost(b->data(), host.data(), sizeof(T) * host.size()).ok());
    buffers_.push_back(std::move(*b));
    return buffers_.back().as<T>();
  }
  std::vector<float> Download(const float* dev, std::size_t n) {
    std::vector<float> out(n);
    EXPECT_TRUE(stream_->Synchronize().ok());
    EXPECT_TRUE(device().CopyToHost(out.data(), dev, sizeof(float) * n).ok());
    return out;
  }

  std::unique_ptr<runtime::Backend> backend_;
  std::unique_ptr<runtime::Stream> stream_;
  std::unique_ptr<Math> math_;
  std::vector<runtime::Buffer> buffers_;
};

TEST_F(ModelGpuTest, GemmMatchesHostInEveryTransposition) {
  for (Transpose ta : {Transpose::kNo, Transpose::kYes}) {
    for (Transpose tb : {Transpose::kNo, Transpose::kYes}) {
      const int m = 67, n = 45, k = 129;
      for (float beta : {0.0f, 1.0f}) {
        std::vector<float> a = RandomFloats(m * k, 1), b = RandomFloats(k * n, 2);
        std::vector<float> c = beta == 0 ? Poisoned(m * n) : RandomFloats(m * n, 3);
        const int lda = ta == Transpose::kNo ? k : m, ldb = tb == Transpose::kNo ? n : k;
        float* dc = Upload(c);
        PS_ASSERT_OK(math_->Gemm(ta, tb, m, n, k, 0.5f, Upload(a), lda, Upload(b), ldb, beta, dc, n,
                                 *stream_));
        host::Gemm(ta, tb, m, n, k, 0.5f, a.data(), lda, b.data(), ldb, beta, c.data(), n);
        EXPECT_TRUE(AllClose("gemm", Download(dc, c.size()), c, 1e-4, 1e-4));
      }
    }
  }
}

TEST_F(ModelGpuTest, ElementwiseAndReductionsMatchHost) {
  const int rows = 96, cols = 130;
  const std::int64_t n = rows * cols;
  std::vector<float> x = RandomFloats(n, 4, 2.5f), dy = RandomFloats(n, 5),
                     bias = RandomFloats(cols, 6);

  std::vector<float> y = x;
  float* dy_ = Upload(y);
  PS_ASSERT_OK(math_->AddBias(dy_, Upload(bias), rows, cols, *stream_));
  host::AddBias(y.data(), bias.data(), rows, cols);
  EXPECT_TRUE(AllClose("add_bias", Download(dy_, n), y, 1e-6, 1e-6));

  std::vector<float> sums = RandomFloats(cols, 7);
  float* dsums = Upload(sums);
  PS_ASSERT_OK(math_->ColumnSumAccumulate(Upload(x), dsums, rows, cols, *stream_));
  host::ColumnSumAccumulate(x.data(), sums.data(), rows, cols);
  EXPECT_TRUE(AllClose("column_sum", Download(dsums, cols), sums, 1e-5, 1e-6));

  std::vector<float> g = Poisoned(n);
  float* dg = Upload(g);
  PS_ASSERT_OK(math_->Gelu(Upload(x), dg, n, *stream_));
  host::Gelu(x.data(), g.data(), n);
  EXPECT_TRUE(AllClose("gelu", Download(dg, n), g, 1e-6, 1e-5));

  std::vector<float> gb = Poisoned(n);
  float* dgb = Upload(gb);
  PS_ASSERT_OK(math_->GeluBackward(Upload(x), Upload(dy), dgb, n, *stream_));
  host::GeluBackward(x.data(), dy.data(), gb.data(), n);
  EXPECT_TRUE(AllClose("gelu_backward", Download(dgb, n), gb, 1e-6, 1e-5));

  std::vector<float> s = Poisoned(n);
  float* ds = Upload(s);
  PS_ASSERT_OK(math_->Add(Upload(x), Upload(dy), ds, n, *stream_));
  host::Add(x.data(), dy.data(), s.data(), n);
  EXPECT_TRUE(AllClose("add", Download(ds, n), s, 0, 0));

  float* df = Upload(Poisoned(n));
  PS_ASSERT_OK(math_->Fill(df, n, -1.25f, *stream_));
  EXPECT_TRUE(AllClose("fill", Download(df, n), std::vector<float>(n, -1.25f), 0, 0));
}

TEST_F(ModelGpuTest, SoftmaxCrossEntropyMatchesHost) {
  for (int classes : {3, 10, 1000}) {
    const int rows = 33;
    std::vector<float> logits = RandomFloats(rows * classes, 8, 3.0f);
    std::vector<std::int32_t> labels = RandomLabels(rows, classes, 9);
    std::vector<float> d = Poisoned(rows * classes), loss = Poisoned(1);
    float* dd = Upload(d);
    float* dloss = Upload(loss);
    PS_ASSERT_OK(math_->SoftmaxCrossEntropy(Upload(logits), Upload(labels), rows, classes, 0.5f,
                                            dloss, dd, *stream_));
    PS_ASSERT_OK(host::SoftmaxCrossEntropy(logits.data(), labels.data(), rows, classes, 0.5f,
                                           loss.data(), d.data()));
    EXPECT_TRUE(AllClose("ce loss", Download(dloss, 1), loss, 1e-6, 1e-6));
    EXPECT_TRUE(AllClose("ce dlogits", Download(dd, d.size()), d, 1e-7, 1e-5));
  }
  // A bad label yields NaN on the GPU (it cannot return a status): in the loss and in its
  // row of dlogits; the other rows are still right (row 0 alone, at the same scale).
  std::vector<float> logits = RandomFloats(6, 10);
  float* dloss = Upload(Poisoned(1));
  float* dd = Upload(Poisoned(6));
  PS_ASSERT_OK(math_->SoftmaxCrossEntropy(Upload(logits), Upload(std::vector<std::int32_t>{0, 5}),
                                          2, 3, 1.0f, dloss, dd, *stream_));
  EXPECT_TRUE(std::isnan(Download(dloss, 1)[0]));
  const std::vector<float> got = Download(dd, 6);
  std::vector<float> row0(3), loss0(1);
  const std::int32_t label0 = 0;
  PS_ASSERT_OK(
      host::SoftmaxCrossEntropy(logits.data(), &label0, 1, 3, 0.5f, loss0.data(), row0.data()));
  EXPECT_TRUE(
      AllClose("ce good row", std::vector<float>(got.begin(), got.begin() + 3), row0, 1e-7, 1e-5));
  for (int c = 3; c < 6; ++c) EXPECT_TRUE(std::isnan(got[c])) << "dlogits[1][" << c - 3 << "]";
}

// Empty shapes behave as on the host: nothing is launched (a grid of 0 blocks would be a
// launch error), gemm with k == 0 gives beta * c (0 for beta == 0, c not read, without
// cuBLAS), and the loss of 0 rows is 0, not 0 / 0.
TEST_F(ModelGpuTest, EmptyShapesMatchHost) {
  const int m = 5, n = 7, ldc = 9;  // ldc > n: the padding must stay untouched
  for (float beta : {0.0f, 0.5f}) {
    std::vector<float> c = RandomFloats(m * ldc, 17);
    if (beta == 0.0f) {
      for (int i = 0; i < m; ++i) std::fill_n(c.begin() + i * ldc, n, NAN);
    }
    float* dc = Upload(c);
    PS_ASSERT_OK(math_->Gemm(Transpose::kYes, Transpose::kNo, m, n, 0, 1.0f, nullptr, m, nullptr, n,
                             beta, dc, ldc, *stream_));
    host::Gemm(Transpose::kYes, Transpose::kNo, m, n, 0, 1.0f, nullptr, m, nullptr, n, beta,
               c.data(), ldc);
    EXPECT_TRUE(AllClose("gemm k=0", Download(dc, c.size()), c, 0, 0)) << "beta " << beta;
  }

  const std::vector<float> x = RandomFloats(m * n, 18);
  float* dx = Upload(x);
  PS_ASSERT_OK(math_->Gemm(Transpose::kNo, Transpose::kNo, 0, n, 3, 1.0f, dx, 3, dx, n, 0.0f, dx, n,
                           *stream_));
  PS_ASSERT_OK(math_->AddBias(dx, dx, 0, n, *stream_));
  PS_ASSERT_OK(math_->AddBias(dx, dx, m, 0, *stream_));
  PS_ASSERT_OK(math_->ColumnSumAccumulate(dx, dx, 0, n, *stream_));  // out += 0
  PS_ASSERT_OK(math_->ColumnSumAccumulate(dx, dx, m, 0, *stream_));
  PS_ASSERT_OK(math_->Gelu(dx, dx, 0, *stream_));
  PS_ASSERT_OK(math_->GeluBackward(dx, dx, dx, 0, *stream_));
  PS_ASSERT_OK(math_->Add(dx, dx, dx, 0, *stream_));
  PS_ASSERT_OK(math_->Fill(dx, 0, 1.0f, *stream_));
  PS_ASSERT_OK(math_->SgdStep(dx, dx, dx, 0, SgdParams{0.1f, 0.9f, 0.0f}, *stream_));
  PS_ASSERT_OK(math_->AdamWStep(dx, dx, dx, dx, 0, AdamWParams{}, 1, *stream_));
  EXPECT_TRUE(AllClose("untouched", Download(dx, x.size()), x, 0, 0));

  float* dloss = Upload(Poisoned(1));
  PS_ASSERT_OK(math_->SoftmaxCrossEntropy(dx, Upload(std::vector<std::int32_t>{0}), 0, n, 1.0f,
                                          dloss, dx, *stream_));
  std::vector<float> loss = Poisoned(1);
  PS_ASSERT_OK(host::SoftmaxCrossEntropy(x.data(), nullptr, 0, n, 1.0f, loss.data(), nullptr));
  EXPECT_TRUE(AllClose("ce loss of 0 rows", Download(dloss, 1), loss, 0, 0));
  EXPECT_TRUE(AllClose("ce logits of 0 rows", Download(dx, x.size()), x, 0, 0));
}

TEST_F(ModelGpuTest, OptimizerStepsMatchHost) {
  const std::int64_t n = 5000;
  std::vector<float> p = RandomFloats(n, 11), g = RandomFloats(n, 12), buf = RandomFloats(n, 13);
  float* dp = Upload(p);
  float* dbuf = Upload(buf);
  const SgdParams sgd{0.05f, 0.9f, 0.01f};
  PS_ASSERT_OK(math_->SgdStep(dp, Upload(g), dbuf, n, sgd, *stream_));
  host::SgdStep(p.data(), g.data(), buf.data(), n, sgd);
  EXPECT_TRUE(AllClose("sgd param", Download(dp, n), p, 1e-6, 1e-6));
  EXPECT_TRUE(AllClose("sgd momentum", Download(dbuf, n), buf, 1e-6, 1e-6));

  std::vector<float> m = RandomFloats(n, 14, 0.1f), v(n);
  for (std::int64_t i = 0; i < n; ++i) v[i] = 0.01f * (1 + (i % 7));
  float* dm = Upload(m);
  float* dv = Upload(v);
  float* dp2 = Upload(p);
  const AdamWParams adamw{1e-3f, 0.9f, 0.999f, 1e-8f, 0.01f};
  PS_ASSERT_OK(math_->AdamWStep(dp2, Upload(g), dm, dv, n, adamw, 3, *stream_));
  host::AdamWStep(p.data(), g.data(), m.data(), v.data(), n, adamw, 3);
  EXPECT_TRUE(AllClose("adamw param", Download(dp2, n), p, 1e-6, 1e-5));
  EXPECT_TRUE(AllClose("adamw m", Download(dm, n), m, 1e-7, 1e-6));
  EXPECT_TRUE(AllClose("adamw v", Download(dv, n), v, 1e-7, 1e-6));
}

// Two training steps of a whole-model chunk on the GPU equal the host's.
TEST_F(ModelGpuTest, ChunkTrainingStepsMatchHost) {
  runtime::BackendOptions host_options;
  host_options.kind = runtime::BackendKind::kHost;
  PS_ASSERT_OK_AND_ASSIGN(auto host_backend, runtime::CreateBackend(host_options));
  PS_ASSERT_OK_AND_ASSIGN(auto host_stream, host_backend->device(0).CreateStream("host"));
  ChunkOptions options;
  options.config = MlpConfig{32, 64, 10, 3};
  options.first_layer = 0;
  options.last_layer = 4;
  options.seed = 5;
  options.optimizer.kind = OptimizerKind::kAdamW;
  PS_ASSERT_OK_AND_ASSIGN(auto gpu, Chunk::Create(options, device()));
  PS_ASSERT_OK_AND_ASSIGN(auto cpu, Chunk::Create(options, host_backend->device(0)));
  const int batch = 16;
  std::vector<float> x = RandomFloats(batch * 32, 15);
  std::vector<std::int32_t> labels = RandomLabels(batch, 10, 16);
  std::vector<float> h_logits(batch * 10), h_dx(x.size()), h_loss(1);
  float* g_x = Upload(x);
  std::int32_t* g_labels = Upload(labels);
  float* g_logits = Upload(h_logits);
  float* g_dx = Upload(h_dx);
  float* g_loss = Upload(h_loss);
  for (int step = 0; step < 2; ++step) {
    PS_ASSERT_OK_AND_ASSIGN(Stash gs, gpu->AllocateStash(batch, *stream_));
    PS_ASSERT_OK(gpu->ZeroGrad(*stream_));
    PS_ASSERT_OK(gpu->Forward(g_x, gs, g_logits, *stream_));
    PS_ASSERT_OK(gpu->Loss(g_logits, g_labels, batch, 1.0f, g_loss, g_logits, *stream_));
    PS_ASSERT_OK(gpu->BackwardInput(g_logits, gs, g_dx, *stream_));
    PS_ASSERT_OK(gpu->BackwardWeight(gs, *stream_));
    PS_ASSERT_OK(gpu->Step(*stream_));
    PS_ASSERT_OK(gs.FreeAsync(*stream_));

    runtime::Stream& hs = *host_stream;
    PS_ASSERT_OK_AND_ASSIGN(Stash cs, cpu->AllocateStash(batch, hs));
    PS_ASSERT_OK(cpu->ZeroGrad(hs));
    PS_ASSERT_OK(cpu->Forward(x.data(), cs, h_logits.data(), hs));
    PS_ASSERT_OK(
        cpu->Loss(h_logits.data(), labels.data(), batch, 1.0f, h_loss.data(), h_logits.data(), hs));
    PS_ASSERT_OK(cpu->Backward(h_logits.data(), cs, h_dx.data(), hs));
    PS_ASSERT_OK(cpu->Step(hs));
    PS_ASSERT_OK(cs.FreeAsync(hs));
    PS_ASSERT_OK(hs.Synchronize());
    EXPECT_TRUE(AllClose("loss", Download(g_loss, 1), h_loss, 1e-5, 1e-5));
    EXPECT_TRUE(AllClose("dx", Download(g_dx, h_dx.size()), h_dx, 1e-6, 1e-4));
  }
  PS_ASSERT_OK(stream_->Synchronize());
  PS_ASSERT_OK_AND_ASSIGN(auto gp, gpu->ExportParameters());
  PS_ASSERT_OK_AND_ASSIGN(auto cp, cpu->ExportParameters());
  for (std::size_t i = 0; i < gp.size(); ++i) {
    EXPECT_TRUE(AllClose(gp[i].name, *gp[i].ToFloats(), *cp[i].ToFloats(), 1e-6, 1e-4));
  }
}

}  // namespace
}  // namespace pipesched::model
