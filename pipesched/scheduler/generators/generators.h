// The built-in schedule generators. Each is a pure function of (P, M, V) that returns
// one program per rank, or InvalidArgument with a sentence naming the violated
// constraint, the value given and what would work. They are listed, with their
// defaults and constraints, in scheduler/registry.cc; callers normally go through
// GenerateSchedule(name, params) there rather than calling these directly.
#pragma once

#include "absl/status/statusor.h"
#include "pipesched/scheduler/registry.h"
#include "pipesched/scheduler/schedule.h"

namespace pipesched::scheduler {

// GPipe: all forwards, then all backwards. P >= 1, M >= 1, V = 1.
absl::StatusOr<Schedule> GenerateGPipe(const GeneratorParams& params);
// 1F1B (PipeDream-flush): P-1-r warm-up forwards on rank r, then one forward one
// backward. P >= 1, M >= 1, V = 1.
absl::StatusOr<Schedule> GenerateOneFOneB(const GeneratorParams& params);
// Megatron interleaved 1F1B on V chunks per rank, loop placement (PyTorch
// ScheduleInterleaved1F1B). V >= 2; M a multiple of max(1, M / P).
absl::StatusOr<Schedule> GenerateInterleaved1F1B(const GeneratorParams& params);
// Interleaved 1F1B with backward split into I and W (PyTorch
// ScheduleInterleavedZeroBubble), loop placement: warm-up (V-1)R + (P-1-r), rank r
// deferring r W's. V >= 2; M a multiple of max(1, M / P).
absl::StatusOr<Schedule> GenerateInterleavedZb(const GeneratorParams& params);
// Breadth-first over chunks (PyTorch ScheduleLoopedBFS), loop placement. V >= 1.
absl::StatusOr<Schedule> GenerateLoopedBfs(const GeneratorParams& params);
// ZB-H1 (Qi et al. 2023): 1F1B with backward split into I and W, rank r deferring
// r W's to fill the bubbles. V = 1.
absl::StatusOr<Schedule> GenerateZbH1(const GeneratorParams& params);
// ZB-V (Qi et al. 2023; PyTorch ScheduleZBVZeroBubble): two chunks per rank in a V,
// I and W split. V = 2.
absl::StatusOr<Schedule> GenerateZbV(const GeneratorParams& params);
// ZB-1p and ZB-2p (Qi et al. 2023, section 3): I and W split, one chunk per rank, the
// order searched for GeneratorParams::costs (unit costs without them) with at most P,
// or 2P, live activations on any rank; its simulated step is never longer than zb-h1's
// under those costs. InvalidArgument for costs it cannot time. V = 1.
absl::StatusOr<Schedule> GenerateZb1p(const GeneratorParams& params);
absl::StatusOr<Schedule> GenerateZb2p(const GeneratorParams& params);
// zb-v-1p: zb-v's placement (two chunks per rank in a V) and peak (2P chunk activations),
// the order searched for GeneratorParams::costs like zb-1p's; never a longer simulated
// step than zb-v's under those costs. V = 2.
absl::StatusOr<Schedule> GenerateZbV1p(const GeneratorParams& params);
// interleaved-zb-1p: interleaved-zb's placement (loop, V >= 2 chunks per rank, default 2)
// within V P chunk activations (P stages' worth, 1F1B's peak), any M, the order searched
// for GeneratorParams::costs like zb-v-1p's; interleaved-zb's own order is a candidate
// where it exists and fits. V >= 2.
absl::StatusOr<Schedule> GenerateInterleavedZb1p(const GeneratorParams& params);
// zb-v-half and zb-v-min: zb-v's placement within V-Half's and V-Min's memory (Qi et al.
// 2024, "Pipeline Parallelism with Controllable Memory"): at most ZbVHalfLimit(P) and
// ZbVMinLimit(P) chunk activations on any rank (capped at 2M), the order searched for
// GeneratorParams::costs like zb-v-1p's. V = 2.
absl::StatusOr<Schedule> GenerateZbVHalf(const GeneratorParams& params);
absl::StatusOr<Schedule> GenerateZbVMin(const GeneratorParams& params);
// DualPipeV (DeepSeek-V3's DualPipe cut in half; PyTorch ScheduleDualPipeV): zb-v's
// placement, forward-with-backward pairs in the steady state, full B's there and I/W
// split at the ends. V = 2, M >= 2P.
absl::StatusOr<Schedule> GenerateDualPipeV(const GeneratorParams& params);
// 2 x floor((P+2)/2) and 2 x floor((P+4)/3) chunk activations: the paper's (P+2)/2 and
// (P+4)/3 micro-batches of 1F1B-sized activations, about 1/2 and 1/3 of 1F1B's P.
int ZbVHalfLimit(int num_ranks);
int ZbVMinLimit(int num_ranks);

}  // namespace pipesched::scheduler
