// The CUDA Math: cuBLAS sgemm in fp32 (CUBLAS_DEFAULT_MATH, which never uses TF32
// tensor cores for sgemm: results stay comparable with the host's OpenBLAS) plus the
// kernels of cuda_kernels.cu. Each op makes the math's device current for its duration
// (restoring the caller's), binds the stream (cublasSetStream per call: one handle serves
// every stream of the device) and checks the launch.
#include <cublas_v2.h>
#include <cuda_runtime_api.h>

#include <cmath>
#include <memory>

#include "absl/strings/str_cat.h"
#include "pipesched/base/cublas_check.h"
#include "pipesched/base/cuda_check.h"
#include "pipesched/base/status.h"
#include "pipesched/model/cuda/cuda_kernels.h"
#include "pipesched/model/math.h"
#include "pipesched/model/math_impl.h"

namespace pipesched::model {
namespace {

cublasOperation_t ToCublas(Transpose t) { return t == Transpose::kYes ? CUBLAS_OP_T : CUBLAS_OP_N; }

class CudaMath final : public Math {
 public:
  CudaMath(int device_index, cublasHandle_t handle) : device_(device_index), handle_(handle) {}
  ~CudaMath() override {
    CudaDeviceGuard guard(device_);
    if (guard.status().ok()) (void)cublasDestroy(handle_);
  }

  runtime::BackendKind kind() const override { return runtime::BackendKind::kCuda; }

  absl::Status Gemm(Transpose trans_a, Transpose trans_b, int m, int n, int k, float alpha,
                    const float* a, int lda, const float* b, int ldb, float beta, float* c, int ldc,
                    runtime::Stream& stream) override {
    return OnStream(stream, [&](cudaStream_t s) -> absl::Status {
      if (m <= 0 || n <= 0) return absl::OkStatus();
      if (k <= 0) {
        // As the host: C = beta * C, 0 when beta == 0. cuBLAS does not document k == 0,
        // and its leading-dimension checks may reject the call then.
        return PS_CUDA_STATUS(cuda_detail::LaunchScaleMatrix(c, m, n, ldc, beta, s));
      }
      PS_CUBLAS_RETURN_IF_ERROR(cublasSetStream(handle_, s));
      // Row-major C = op(A) op(B) is column-major C^T = op(B)^T op(A)^T: swap the operands.
      PS_CUBLAS_RETURN_IF_ERROR(cublasSgemm(handle_, ToCublas(trans_b), ToCublas(trans_a), n, m, k,
                                            &alpha, b, ldb, a, lda, &beta, c, ldc));
      return absl::OkStatus();
    });
  }
  absl::Status AddBias(float* y, const float* bias, int rows, int cols,
                       runtime::Stream& stream) override {
    return OnStream(stream, [&](cudaStream_t s) {
      return PS_CUDA_STATUS(cuda_detail::LaunchAddBias(y, bias, rows, cols, s));
    });
  }
  absl::Status ColumnSumAccumulate(const float* x, float* out, int rows, int cols,
                                   runtime::Stream& stream) override {
    return OnStream(stream, [&](cudaStream_t s) {
      return PS_CUDA_STATUS(cuda_detail::LaunchColumnSumAccumulate(x, out, rows, cols, s));
    });
  }
  absl::Status Gelu(const float* x, float* y, std::int64_t n, runtime::Stream& stream) override {
    return OnStream(stream, [&](cudaStream_t s) {
      return PS_CUDA_STATUS(cuda_detail::LaunchGelu(x, y, n, s));
    });
  }
  absl::Status GeluBackward(const float* x, const float* dy, float* dx, std::int64_t n,
                            runtime::Stream& stream) override {
    return OnStream(stream, [&](cudaStream_t s) {
      return PS_CUDA_STATUS(cuda_detail::LaunchGeluBackward(x, dy, dx, n, s));
    });
  }
  absl::Status Add(const float* a, const float* b, float* out, std::int64_t n,
                   runtime::Stream& stream) override {
    return OnStream(stream, [&](cudaStream_t s) {
      return PS_CUDA_STATUS(cuda_detail::LaunchAdd(a, b, out, n, s));
    });
  }
  absl::Status Fill(float* x, std::int64_t n, float value, runtime::Stream& stream) override {
    return OnStream(stream, [&](cudaStream_t s) {
      return PS_CUDA_STATUS(cuda_detail::LaunchFill(x, n, value, s));
    });
  }
  absl::Status SoftmaxCrossEntropy(const float* logits, const std::int32_t* labels, int rows,
                                   int classes, float grad_scale, float* loss, float* dlogits,
                                   runtime::Stream& stream) override {
    return OnStream(stream, [&](cudaStream_t s) {
      return PS_CUDA_STATUS(cuda_detail::LaunchSoftmaxCrossEntropy(logits, labels, rows, classes,
                                                                   grad_scale, loss, dlogits, s));
    });
  }
  absl::Status SgdStep(float* param, const float* grad, float* momentum_buf, std::int64_t n,
                       const SgdParams& p, runtime::Stream& stream) override {
    return OnStream(stream, [&](cudaStream_t s) {
      return PS_CUDA_STATUS(cuda_detail::LaunchSgdStep(param, grad, momentum_buf, n, p.lr,
                                                       p.momentum, p.weight_decay, s));
    });
  }
  absl::Status AdamWStep(float* param, const float* grad, float* m, float* v, std::int64_t n,
                         const AdamWParams& p, std::int64_t step,
                         runtime::Stream& stream) override {
    const double bc1 = 1.0 - std::pow(static_cast<double>(p.beta1), static_cast<double>(step));
    const double bc2 = 1.0 - std::pow(static_cast<double>(p.beta2), static_cast<double>(step));
    return OnStream(stream, [&](cudaStream_t s) {
      return PS_CUDA_STATUS(cuda_detail::LaunchAdamWStep(
          param, grad, m, v, n, p.lr, p.beta1, p.beta2, p.eps, p.weight_decay,
          static_cast<float>(p.lr / bc1), static_cast<float>(std::sqrt(bc2)), s));
    });
  }

 private:
  // Runs `enqueue` with the stream's cudaStream_t while this math's device is current.
  // InvalidArgument for a stream of another device or backend.
  template <typename Enqueue>
  absl::Status OnStream(runtime::Stream& stream, Enqueue&& enqueue) {
    if (stream.device().kind() != runtime::BackendKind::kCuda ||
        stream.device().index() != device_) {
      return absl::InvalidArgumentError(absl::StrCat("CUDA model math of cuda:", device_,
                                                     " used with stream '", stream.name(), "' of ",
                                                     stream.device().description()));
    }
    CudaDeviceGuard guard(device_);
    PS_RETURN_IF_ERROR(guard.status());
    return enqueue(static_cast<cudaStream_t>(stream.native_handle()));
  }

  const int device_;
  const cublasHandle_t handle_;
};

}  // namespace

absl::StatusOr<std::unique_ptr<Math>> internal::CreateCudaMath(runtime::Device& device) {
  CudaDeviceGuard guard(device.index());  // the handle belongs to the device current here
  PS_RETURN_IF_ERROR(guard.status());
  cublasHandle_t handle = nullptr;
  PS_CUBLAS_RETURN_IF_ERROR(cublasCreate(&handle));
  auto math = std::make_unique<CudaMath>(device.index(), handle);  // owns the handle from here
  // TF32 stays off: the default never uses it for sgemm (CUBLAS_TF32_TENSOR_OP_MATH would,
  // with ~1e-3 relative error), so results agree with the host's to ~1e-5, which the GPU
  // tests rely on. Not CUBLAS_PEDANTIC_MATH, which cuBLAS documents as a mode for
  // numerical studies and debugging that may be slower.
  PS_CUBLAS_RETURN_IF_ERROR(cublasSetMathMode(handle, CUBLAS_DEFAULT_MATH));
  return math;
}

}  // namespace pipesched::model
