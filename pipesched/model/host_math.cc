// The host Math: each op is one closure on the stream's worker thread running the
// synchronous kernel of host_kernels.h. Arguments are captured by value, so callers may
// reuse their own variables as soon as the op returns.
#include <memory>

#include "absl/strings/str_cat.h"
#include "pipesched/model/host_kernels.h"
#include "pipesched/model/math.h"
#include "pipesched/model/math_impl.h"

namespace pipesched::model {
namespace {

class HostMath final : public Math {
 public:
  runtime::BackendKind kind() const override { return runtime::BackendKind::kHost; }

  absl::Status Gemm(Transpose trans_a, Transpose trans_b, int m, int n, int k, float alpha,
                    const float* a, int lda, const float* b, int ldb, float beta, float* c, int ldc,
                    runtime::Stream& stream) override {
    return Enqueue(stream, [=] {
      host::Gemm(trans_a, trans_b, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
      return absl::OkStatus();
    });
  }
  absl::Status AddBias(float* y, const float* bias, int rows, int cols,
                       runtime::Stream& stream) override {
    return Enqueue(stream, [=] {
      host::AddBias(y, bias, rows, cols);
      return absl::OkStatus();
    });
  }
  absl::Status ColumnSumAccumulate(const float* x, float* out, int rows, int cols,
                                   runtime::Stream& stream) override {
    return Enqueue(stream, [=] {
      host::ColumnSumAccumulate(x, out, rows, cols);
      return absl::OkStatus();
    });
  }
  absl::Status Gelu(const float* x, float* y, std::int64_t n, runtime::Stream& stream) override {
    return Enqueue(stream, [=] {
      host::Gelu(x, y, n);
      return absl::OkStatus();
    });
  }
  absl::Status GeluBackward(const float* x, const float* dy, float* dx, std::int64_t n,
                            runtime::Stream& stream) override {
    return Enqueue(stream, [=] {
      host::GeluBackward(x, dy, dx, n);
      return absl::OkStatus();
    });
  }
  absl::Status Add(const float* a, const float* b, float* out, std::int64_t n,
                   runtime::Stream& stream) override {
    return Enqueue(stream, [=] {
      host::Add(a, b, out, n);
      return absl::OkStatus();
    });
  }
  absl::Status Fill(float* x, std::int64_t n, float value, runtime::Stream& stream) override {
    return Enqueue(stream, [=] {
      host::Fill(x, n, value);
      return absl::OkStatus();
    });
  }
  absl::Status SoftmaxCrossEntropy(const float* logits, const std::int32_t* labels, int rows,
                                   int classes, float grad_scale, float* loss, float* dlogits,
                                   runtime::Stream& stream) override {
    return Enqueue(stream, [=] {
      return host::SoftmaxCrossEntropy(logits, labels, rows, classes, grad_scale, loss, dlogits);
    });
  }
  absl::Status SgdStep(float* param, const float* grad, float* momentum_buf, std::int64_t n,
                       const SgdParams& params, runtime::Stream& stream) override {
    return Enqueue(stream, [=] {
      host::SgdStep(param, grad, momentum_buf, n, params);
      return absl::OkStatus();
    });
  }
  absl::Status AdamWStep(float* param, const float* grad, float* m, float* v, std::int64_t n,
                         const AdamWParams& params, std::int64_t step,
                         runtime::Stream& stream) override {
    return Enqueue(stream, [=] {
      host::AdamWStep(param, grad, m, v, n, params, step);
      return absl::OkStatus();
    });
  }

 private:
  template <typename Fn>
  static absl::Status Enqueue(runtime::Stream& stream, Fn fn) {
    if (stream.device().kind() != runtime::BackendKind::kHost) {
      return absl::InvalidArgumentError(absl::StrCat("host model math used with stream '",
                                                     stream.name(), "' of ",
                                                     stream.device().description()));
    }
    return stream.EnqueueHost(std::move(fn));
  }
};

}  // namespace

absl::Status internal::PrepareHostMath(int concurrent_streams) {
  return host::ReserveBlasWorkspaces(concurrent_streams);
}

absl::StatusOr<std::unique_ptr<Math>> internal::CreateHostMath(runtime::Device& device) {
  host::SetBlasSingleThreaded();
  return std::make_unique<HostMath>();
}

}  // namespace pipesched::model
