// See busy_wait.h.
#include "pipesched/runtime/cuda/busy_wait.h"

namespace pipesched::runtime::cuda_detail {
namespace {

__device__ unsigned long long GlobalTimerNs() {
  unsigned long long t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}

// One thread; sleeps between polls so it does not compete with real work for issue slots.
__global__ void BusyWaitKernel(unsigned long long nanoseconds) {
  const unsigned long long start = GlobalTimerNs();
  while (GlobalTimerNs() - start < nanoseconds) __nanosleep(500);
}

}  // namespace

cudaError_t LaunchBusyWait(unsigned long long nanoseconds, cudaStream_t stream) {
  // Clear an earlier call's non-sticky error first, so that the check after the launch
  // reports this launch's error only.
  (void)cudaGetLastError();
  BusyWaitKernel<<<1, 1, 0, stream>>>(nanoseconds);
  return cudaGetLastError();
}

}  // namespace pipesched::runtime::cuda_detail
