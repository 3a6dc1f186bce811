// Internal: the small CUDA kernels of the model (everything but gemm, which is cuBLAS),
// as plain launchers so that nvcc never sees Abseil. Each launches on `stream` (of the
// current device), returns immediately, and returns the error of its own launch (the
// last-error slot is cleared before it) or cudaSuccess; the semantics are those of the
// matching op in model/math.h and model/host_kernels.cc, empty shapes included (they
// launch nothing, except that the loss of 0 rows is written as 0).
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

namespace pipesched::model::cuda_detail {

cudaError_t LaunchAddBias(float* y, const float* bias, int rows, int cols, cudaStream_t stream);
cudaError_t LaunchColumnSumAccumulate(const float* x, float* out, int rows, int cols,
                                      cudaStream_t stream);
cudaError_t LaunchGelu(const float* x, float* y, std::int64_t n, cudaStream_t stream);
cudaError_t LaunchGeluBackward(const float* x, const float* dy, float* dx, std::int64_t n,
                               cudaStream_t stream);
cudaError_t LaunchAdd(const float* a, const float* b, float* out, std::int64_t n,
                      cudaStream_t stream);
cudaError_t LaunchFill(float* x, std::int64_t n, float value, cudaStream_t stream);
// c: (rows, cols) with leading dimension ldc; c = beta * c, 0 when beta == 0 (c is then
// not read). Gemm with k <= 0.
cudaError_t LaunchScaleMatrix(float* c, int rows, int cols, int ldc, float beta,
                              cudaStream_t stream);
cudaError_t LaunchSoftmaxCrossEntropy(const float* logits, const std::int32_t* labels, int rows,
                                      int classes, float grad_scale, float* loss, float* dlogits,
                                      cudaStream_t stream);
cudaError_t LaunchSgdStep(float* param, const float* grad, float* momentum_buf, std::int64_t n,
                          float lr, float momentum, float weight_decay, cudaStream_t stream);
// step_size = lr / (1 - beta1^t), bc2_sqrt = sqrt(1 - beta2^t), computed on the host.
cudaError_t LaunchAdamWStep(float* param, const float* grad, float* m, float* v, std::int64_t n,
                            float lr, float beta1, float beta2, float eps, float weight_decay,
                            float step_size, float bc2_sqrt, cudaStream_t stream);

}  // namespace pipesched::model::cuda_detail
