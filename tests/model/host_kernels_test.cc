// Every host op against a naive double-precision reference on random inputs, outputs
// poisoned with NaN first.
#include "pipesched/model/host_kernels.h"

#include <cblas.h>
#include <unistd.h>

#include <barrier>
#include <cmath>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "model_test_util.h"
#include "pipesched/base/host_memory.h"
#include "testing/capped_child.h"
#include "testing/status_matchers.h"

namespace pipesched::model {
namespace {

using testing::AllClose;
using testing::Poisoned;
using testing::RandomFloats;
using testing::RandomLabels;

double RefGelu(double x) { return 0.5 * x * (1.0 + std::erf(x / std::sqrt(2.0))); }
double RefGeluGrad(double x) {
  return 0.5 * (1.0 + std::erf(x / std::sqrt(2.0))) +
         x * std::exp(-0.5 * x * x) / std::sqrt(2.0 * M_PI);
}

struct GemmCase {
  Transpose ta, tb;
  int m, n, k;
  float alpha, beta;
};

class GemmTest : public ::testing::TestWithParam<GemmCase> {};

TEST_P(GemmTest, MatchesDoubleReference) {
  const GemmCase p = GetParam();
  // Stored shapes: a is (m, k) or (k, m) when transposed; padded leading dims.
  const int a_rows = p.ta == Transpose::kNo ? p.m : p.k;
  const int a_cols = p.ta == Transpose::kNo ? p.k : p.m;
  const int b_rows = p.tb == Transpose::kNo ? p.k : p.n;
  const int b_cols = p.tb == Transpose::kNo ? p.n : p.k;
  const int lda = a_cols + 3, ldb = b_cols + 1, ldc = p.n + 2;
  std::vector<float> a = RandomFloats(static_cast<std::size_t>(a_rows) * lda, 1);
  std::vector<float> b = RandomFloats(static_cast<std::size_t>(b_rows) * ldb, 2);
  std::vector<float> c = p.beta == 0.0f ? Poisoned(static_cast<std::size_t>(p.m) * ldc)
                                        : RandomFloats(static_cast<std::size_t>(p.m) * ldc, 3);
  std::vector<double> want(c.size());
  for (int i = 0; i < p.m; ++i) {
    for (int j = 0; j < ldc; ++j) {
      if (j >= p.n) {
        want[i * ldc + j] = c[i * ldc + j];  // padding untouched
        continue;
      }
      double acc = 0.0;
      for (int l = 0; l < p.k; ++l) {
        const double av = p.ta == Transpose::kNo ? a[i * lda + l] : a[l * lda + i];
        const double bv = p.tb == Transpose::kNo ? b[l * ldb + j] : b[j * ldb + l];
        acc += av * bv;
      }
      want[i * ldc + j] = p.alpha * acc + (p.beta == 0.0f ? 0.0 : p.beta * c[i * ldc + j]);
    }
  }
  host::SetBlasSingleThreaded();
  host::Gemm(p.ta, p.tb, p.m, p.n, p.k, p.alpha, a.data(), lda, b.data(), ldb, p.beta, c.data(),
             ldc);
  // Padding columns of a poisoned c stay NaN in both; compare only the written part.
  std::vector<float> got_core;
  std::vector<double> want_core;
  for (int i = 0; i < p.m; ++i) {
    for (int j = 0; j < p.n; ++j) {
      got_core.push_back(c[i * ldc + j]);
      want_core.push_back(want[i * ldc + j]);
    }
  }
  EXPECT_TRUE(AllClose("gemm", got_core, want_core, 1e-4, 1e-4));
}

INSTANTIATE_TEST_SUITE_P(
    Shapes, GemmTest,
    ::testing::Values(GemmCase{Transpose::kNo, Transpose::kYes, 17, 33, 9, 1.0f, 0.0f},
                      GemmCase{Transpose::kNo, Transpose::kNo, 8, 5, 31, 1.0f, 1.0f},
                      GemmCase{Transpose::kYes, Transpose::kNo, 12, 7, 16, 0.5f, 1.0f},
                      GemmCase{Transpose::kYes, Transpose::kYes, 3, 4, 5, 2.0f, 0.0f},
                      GemmCase{Transpose::kNo, Transpose::kYes, 64, 128, 96, 1.0f, 0.0f}));

TEST(HostKernelsTest, GemmWithZeroInnerDimensionOverwritesWithBetaZero) {
  std::vector<float> c = Poisoned(6);
  host::Gemm(Transpose::kNo, Transpose::kNo, 2, 3, 0, 1.0f, nullptr, 1, nullptr, 3, 0.0f, c.data(),
             3);
  EXPECT_TRUE(AllClose("gemm k=0", c, std::vector<double>(6, 0.0), 0, 0));
}

TEST(HostKernelsTest, AddBias) {
  const int rows = 7, cols = 13;
  std::vector<float> y = RandomFloats(rows * cols, 4), bias = RandomFloats(cols, 5);
  std::vector<double> want(y.size());
  for (int r = 0; r < rows; ++r)
    for (int c = 0; c < cols; ++c) want[r * cols + c] = double(y[r * cols + c]) + bias[c];
  host::AddBias(y.data(), bias.data(), rows, cols);
  EXPECT_TRUE(AllClose("add_bias", y, want, 1e-6, 1e-6));
}

TEST(HostKernelsTest, ColumnSumAccumulate) {
  const int rows = 37, cols = 11;
  std::vector<float> x = RandomFloats(rows * cols, 6), out = RandomFloats(cols, 7);
  std::vector<double> want(out.begin(), out.end());
  for (int r = 0; r < rows; ++r)
    for (int c = 0; c < cols; ++c) want[c] += x[r * cols + c];
  host::ColumnSumAccumulate(x.data(), out.data(), rows, cols);
  EXPECT_TRUE(AllClose("column_sum", out, want, 1e-5, 1e-6));
}

TEST(HostKernelsTest, GeluForwardAndBackward) {
  const int n = 1001;
  std::vector<float> x = RandomFloats(n, 8, 3.0f), dy = RandomFloats(n, 9);
  std::vector<float> y = Poisoned(n), dx = Poisoned(n);
  std::vector<double> want_y(n), want_dx(n);
  for (int i = 0; i < n; ++i) {
    want_y[i] = RefGelu(x[i]);
    want_dx[i] = dy[i] * RefGeluGrad(x[i]);
  }
  host::Gelu(x.data(), y.data(), n);
  host::GeluBackward(x.data(), dy.data(), dx.data(), n);
  EXPECT_TRUE(AllClose("gelu", y, want_y, 1e-6, 1e-5));
  EXPECT_TRUE(AllClose("gelu_backward", dx, want_dx, 1e-6, 1e-5));
  // In place, as the chunk uses them.
  std::vector<float> z = x;
  host::GeluBackward(z.data(), dy.data(), z.data(), n);
  EXPECT_TRUE(AllClose("gelu_backward in place", z, want_dx, 1e-6, 1e-5));
}

TEST(HostKernelsTest, AddAndFill) {
  const int n = 99;
  std::vector<float> a = RandomFloats(n, 10), b = RandomFloats(n, 11), out = Poisoned(n);
  std::vector<double> want(n);
  for (int i = 0; i < n; ++i) want[i] = double(a[i]) + b[i];
  host::Add(a.data(), b.data(), out.data(), n);
  EXPECT_TRUE(AllClose("add", out, want, 1e-6, 1e-6));
  std::vector<float> f = Poisoned(n);
  host::Fill(f.data(), n, 2.5f);
  EXPECT_TRUE(AllClose("fill", f, std::vector<double>(n, 2.5), 0, 0));
}

TEST(HostKernelsTest, SoftmaxCrossEntropy) {
  const int rows = 9, classes = 6;
  const float scale = 0.25f;
  std::vector<float> logits = RandomFloats(rows * classes, 12, 4.0f);
  logits[0] = 80.0f;  // large logits must not overflow
  std::vector<std::int32_t> labels = RandomLabels(rows, classes, 13);
  std::vector<float> d = Poisoned(rows * classes), loss = Poisoned(1);
  std::vector<double> want_d(d.size());
  double want_loss = 0.0;
  for (int r = 0; r < rows; ++r) {
    double mx = -1e300;
    for (int c = 0; c < classes; ++c) mx = std::max(mx, double(logits[r * classes + c]));
    double sum = 0.0;
    for (int c = 0; c < classes; ++c) sum += std::exp(logits[r * classes + c] - mx);
    want_loss += -(logits[r * classes + labels[r]] - mx - std::log(sum)) / rows;
    for (int c = 0; c < classes; ++c) {
      const double p = std::exp(logits[r * classes + c] - mx) / sum;
      want_d[r * classes + c] = scale / rows * (p - (c == labels[r]));
    }
  }
  PS_ASSERT_OK(host::SoftmaxCrossEntropy(logits.data(), labels.data(), rows, classes, scale,
                                         loss.data(), d.data()));
  EXPECT_TRUE(AllClose("ce loss", loss, std::vector<double>{want_loss}, 1e-5, 1e-5));
  EXPECT_TRUE(AllClose("ce dlogits", d, want_d, 1e-7, 1e-5));
  // dlogits may alias logits.
  std::vector<float> in_place = logits;
  PS_ASSERT_OK(host::SoftmaxCrossEntropy(in_place.data(), labels.data(), rows, classes, scale,
                                         loss.data(), in_place.data()));
  EXPECT_TRUE(AllClose("ce dlogits in place", in_place, want_d, 1e-7, 1e-5));
}

TEST(HostKernelsTest, SoftmaxCrossEntropyRejectsLabelOutOfRange) {
  std::vector<float> logits = RandomFloats(6, 14), d(6), loss(1);
  std::vector<std::int32_t> labels = {0, 3};
  EXPECT_THAT(
      host::SoftmaxCrossEntropy(logits.data(), labels.data(), 2, 3, 1.0f, loss.data(), d.data()),
      pipesched::testing::StatusIs(absl::StatusCode::kInvalidArgument,
                                   ::testing::HasSubstr("label 3 of sample 1")));
}

// Hand-computed: p = 1, g = 0.5, lr 0.1, momentum 0.9, weight decay 0.1.
TEST(HostKernelsTest, SgdStepsByHand) {
  SgdParams params{0.1f, 0.9f, 0.1f};
  std::vector<float> p = {1.0f}, g = {0.5f}, buf = {0.0f};
  host::SgdStep(p.data(), g.data(), buf.data(), 1, params);
  // d = 0.5 + 0.1 * 1 = 0.6; buf = 0.6; p = 1 - 0.06 = 0.94
  EXPECT_NEAR(buf[0], 0.6f, 1e-7);
  EXPECT_NEAR(p[0], 0.94f, 1e-7);
  host::SgdStep(p.data(), g.data(), buf.data(), 1, params);
  // d = 0.5 + 0.094 = 0.594; buf = 0.54 + 0.594 = 1.134; p = 0.94 - 0.1134 = 0.8266
  EXPECT_NEAR(buf[0], 1.134f, 1e-6);
  EXPECT_NEAR(p[0], 0.8266f, 1e-6);
  // Without momentum the buffer is not touched (may be null).
  std::vector<float> q = {2.0f};
  host::SgdStep(q.data(), g.data(), nullptr, 1, SgdParams{0.1f, 0.0f, 0.0f});
  EXPECT_NEAR(q[0], 1.95f, 1e-7);
}

TEST(HostKernelsTest, AdamWStepsByHand) {
  AdamWParams params{0.1f, 0.9f, 0.999f, 1e-8f, 0.01f};
  std::vector<float> p = {1.0f}, g = {0.5f}, m = {0.0f}, v = {0.0f};
  host::AdamWStep(p.data(), g.data(), m.data(), v.data(), 1, params, 1);
  // p = 1 * (1 - 0.001) = 0.999; m = 0.05; v = 0.00025; mhat = 0.5; vhat = 0.25;
  // p -= 0.1 * 0.5 / (0.5 + 1e-8) -> 0.899
  EXPECT_NEAR(m[0], 0.05f, 1e-7);
  EXPECT_NEAR(v[0], 0.00025f, 1e-8);  // (1 - 0.999f) rounds in float
  EXPECT_NEAR(p[0], 0.899f, 1e-6);
  std::vector<float> g2 = {-1.0f};
  host::AdamWStep(p.data(), g2.data(), m.data(), v.data(), 1, params, 2);
  // p = 0.899 * 0.999 = 0.898101; m = 0.045 - 0.1 = -0.055; v = 0.00024975 + 0.001
  // = 0.00124975; mhat = -0.055 / 0.19 = -0.289474; vhat = 0.00124975 / 0.001999 =
  // 0.625188; p -= 0.1 * -0.289474 / 0.790688 -> 0.898101 + 0.036610 = 0.934711
  const double mhat = -0.055 / (1 - 0.81);
  const double vhat = 0.00124975 / (1 - 0.999 * 0.999);
  EXPECT_NEAR(p[0], 0.898101 - 0.1 * mhat / (std::sqrt(vhat) + 1e-8), 1e-6);
  EXPECT_NEAR(p[0], 0.934711, 1e-5);
}

// OpenBLAS maps a work buffer (128 MiB of address space here) when every buffer of its pool
// is in use, and retries forever when it cannot: under `ulimit -v`, threads multiplying at
// once hung. Buffers reserved beforehand are taken without mapping.
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
#define PS_SKIP_UNDER_SANITIZERS() \
  GTEST_SKIP() << "the sanitizers' runtimes need more address space than the cap leaves"
#else
#define PS_SKIP_UNDER_SANITIZERS()
#endif

TEST(HostKernelsTest, ReservedBlasBuffersLetThreadsMultiplyUnderATightLimit) {
  PS_SKIP_UNDER_SANITIZERS();
  constexpr int kThreads = 3;
  PS_ASSERT_OK(host::ReserveBlasWorkspaces(kThreads));
  EXPECT_GE(host::ReservedBlasWorkspaces(), kThreads);
  PS_EXPECT_OK(host::ReserveBlasWorkspaces(1));  // fewer than made sure of: nothing to do
  // Room for the threads' stacks and 24 MiB more, not for another buffer.
  const std::size_t headroom =
      kThreads * static_cast<std::size_t>(DefaultThreadStackBytes()) + (std::size_t{24} << 20);
  const std::optional<int> code = pipesched::testing::RunWithCappedAddressSpace(headroom, [] {
    ::alarm(60);  // a hang ends the child with SIGALRM: the test fails, not the run
    // 256 x 256 x 256: above the size OpenBLAS multiplies without a buffer.
    constexpr int n = 256;
    std::vector<float> a(n * n, 0.5f), b(n * n, 0.25f);
    std::vector<std::vector<float>> c(kThreads, std::vector<float>(n * n, -1.0f));
    std::barrier start(kThreads);
    std::vector<std::thread> threads;
    try {
      for (int t = 0; t < kThreads; ++t) {
        threads.emplace_back([&, t] {
          start.arrive_and_wait();
          for (int i = 0; i < 20; ++i) {
            host::Gemm(Transpose::kNo, Transpose::kNo, n, n, n, 1.0f, a.data(), n, b.data(), n,
                       0.0f, c[t].data(), n);
          }
        });
      }
    } catch (const std::system_error&) {
      std::_Exit(7);  // a thread could not start: the cap is too tight for this test
    }
    for (std::thread& thread : threads) thread.join();
    for (const std::vector<float>& out : c) {
      if (out[0] != 0.5f * 0.25f * n || out[n * n - 1] != 0.5f * 0.25f * n) return 8;
    }
    return 0;
  });
  ASSERT_TRUE(code.has_value()) << "the child hung (SIGALRM) or crashed";
  EXPECT_EQ(*code, 0) << "3/4: setup failed, 7: no thread, 8: wrong product";
}

TEST(HostKernelsTest, ReservingABlasBufferWithoutRoomNamesTheLimit) {
  PS_SKIP_UNDER_SANITIZERS();
  if (host::ReservedBlasWorkspaces() >= host::BlasPoolSize()) {
    GTEST_SKIP() << "the whole pool is reserved in this process: nothing is left to map";
  }
  // Before the fork: in the child (whose OpenBLAS threads the fork stopped) the first call
  // would start them again, with no room for their stacks.
  host::SetBlasSingleThreaded();
  const std::optional<int> code =
      pipesched::testing::RunWithCappedAddressSpace(std::size_t{32} << 20, [] {
        ::alarm(60);
        const int before = host::ReservedBlasWorkspaces();
        const absl::Status status = host::ReserveBlasWorkspaces(before + 1);
        if (!absl::IsResourceExhausted(status)) return 10;
        const std::string expected_start = absl::StrCat(
            "OpenBLAS maps a 128.00 MiB work buffer for each of ", before + 1,
            " threads multiplying at once and cannot map buffer ", before + 1,
            " (it would retry forever): this process's address-space limit (ulimit -v) leaves ");
        if (std::string(status.message()).rfind(expected_start, 0) != 0) {
          std::fprintf(stderr, "%s\n", std::string(status.message()).c_str());
          return 11;
        }
        return host::ReservedBlasWorkspaces() == before ? 0 : 12;
      });
  ASSERT_TRUE(code.has_value()) << "the child hung (SIGALRM) or crashed";
  EXPECT_EQ(*code, 0) << "3/4: setup failed, 10: not ResourceExhausted, 11: another message, "
                         "12: the count moved";
}

// Past its pool OpenBLAS maps a buffer on every use, and 0.3.21 wrote past its own array
// when several hundred were held: the reservation stops at the pool (P x D = 642 streams
// made that happen).
TEST(HostKernelsTest, ReservationStopsAtOpenBlasPool) {
  // Debian 12's OpenBLAS: MAX_THREADS=64, 128 slots, one per CPU but one for its threads.
  EXPECT_EQ(host::BlasPoolSize(), 128 - (std::min(openblas_get_num_procs(), 64) - 1));
  PS_ASSERT_OK(host::ReserveBlasWorkspaces(642));
  EXPECT_EQ(host::ReservedBlasWorkspaces(), host::BlasPoolSize());
}

// Under a mapping limit more threads than the pool would map on each use, and could
// hang there: refused, naming the pool and the limit, even with room to spare now.
TEST(HostKernelsTest, MoreThreadsThanThePoolAreRefusedUnderAMappingLimit) {
  PS_SKIP_UNDER_SANITIZERS();
  const int pool = host::BlasPoolSize();
  host::SetBlasSingleThreaded();  // before the fork (the child's OpenBLAS threads are gone)
  const std::optional<int> code =
      pipesched::testing::RunWithCappedAddressSpace(std::size_t{4} << 30, [pool] {
        ::alarm(60);
        const absl::Status status = host::ReserveBlasWorkspaces(pool + 1);
        if (!absl::IsResourceExhausted(status)) return 10;
        const std::string expected_start = absl::StrCat(
            "OpenBLAS keeps ", pool, " work buffers mapped for reuse, and ", pool + 1,
            " threads multiplying at once are more: past them it maps a buffer on each use, "
            "and retries forever where a mapping fails, which a limit on mappings makes "
            "possible: this process's address-space limit (ulimit -v) leaves ");
        const std::string message(status.message());
        if (message.rfind(expected_start, 0) != 0 ||
            !absl::EndsWith(message, absl::StrCat("; use at most ", pool,
                                                  " threads multiplying at once, or lift the "
                                                  "limit"))) {
          std::fprintf(stderr, "%s\n", message.c_str());
          return 11;
        }
        // The pool itself is still fine to ask for.
        return host::ReserveBlasWorkspaces(1).ok() ? 0 : 12;
      });
  ASSERT_TRUE(code.has_value()) << "the child hung (SIGALRM) or crashed";
  EXPECT_EQ(*code, 0) << "3/4: setup failed, 10: not ResourceExhausted, 11: another message, "
                         "12: one buffer refused";
}

}  // namespace
}  // namespace pipesched::model
