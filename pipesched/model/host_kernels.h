// The host implementation of every op of model/math.h as plain synchronous functions on
// host pointers (row-major). HostMath enqueues these as closures; tests call them
// directly against double-precision references. Gemm goes to OpenBLAS's cblas_sgemm,
// which must run single-threaded (SetBlasSingleThreaded) so that several stream threads
// can each run one.
#pragma once

#include <cstdint>

#include "absl/status/status.h"
#include "pipesched/model/math.h"

namespace pipesched::model::host {

// Makes OpenBLAS run each call on the calling thread only. Idempotent.
void SetBlasSingleThreaded();

// OpenBLAS's sgemm works in a buffer from a pool that all threads share. When every
// buffer is in use it maps a new one (128 MiB of address space on x86-64), keeps it until
// the process exits, and -- when the mapping fails, under `ulimit -v` or `ulimit -d` --
// retries forever: the step hangs. This makes the pool hold at least `concurrent` buffers
// now, mapping each only after checking that those limits leave room for it, so that
// `concurrent` threads can multiply at once without mapping. ResourceExhausted naming the
// limit and what it leaves otherwise (the buffers mapped before stay in the pool).
// Thread-safe; returns at once when that many were made sure of before. Assumes no other
// thread multiplies meanwhile (one that does may take a buffer this counts on). At most
// the pool's size (BlasPoolSize) is reserved: past it OpenBLAS maps a buffer on every use,
// so more than that is ResourceExhausted under such a limit (it could hang), and reserves
// the pool without one. The
// count is a maximum over calls, not a sum: two trainers stepping at once in one process
// need a call with both counts added.
absl::Status ReserveBlasWorkspaces(int concurrent);

// The slots of OpenBLAS's pool of work buffers that callers can hold: max(50, 2 x
// MAX_THREADS) of its build (128 for Debian 12's) less one held by each of OpenBLAS's own
// threads (one per CPU but one): 127 on 2 CPUs.
int BlasPoolSize();

// How many buffers ReserveBlasWorkspaces has made sure of in this process.
int ReservedBlasWorkspaces();

void Gemm(Transpose trans_a, Transpose trans_b, int m, int n, int k, float alpha, const float* a,
          int lda, const float* b, int ldb, float beta, float* c, int ldc);
void AddBias(float* y, const float* bias, int rows, int cols);
void ColumnSumAccumulate(const float* x, float* out, int rows, int cols);
void Gelu(const float* x, float* y, std::int64_t n);
void GeluBackward(const float* x, const float* dy, float* dx, std::int64_t n);
void Add(const float* a, const float* b, float* out, std::int64_t n);
void Fill(float* x, std::int64_t n, float value);
// InvalidArgument naming the row and label when a label is out of [0, classes).
absl::Status SoftmaxCrossEntropy(const float* logits, const std::int32_t* labels, int rows,
                                 int classes, float grad_scale, float* loss, float* dlogits);
void SgdStep(float* param, const float* grad, float* momentum_buf, std::int64_t n,
             const SgdParams& params);
void AdamWStep(float* param, const float* grad, float* m, float* v, std::int64_t n,
               const AdamWParams& params, std::int64_t step);

}  // namespace pipesched::model::host
