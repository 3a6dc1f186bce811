// Skew injection (stages/slow_stage_work.h).
#include "pipesched/stages/slow_stage_work.h"

#include <chrono>
#include <cmath>
#include <thread>

#include "absl/strings/str_cat.h"
#include "pipesched/base/status.h"

namespace pipesched::stages {

absl::StatusOr<std::unique_ptr<SlowStageWork>> SlowStageWork::Create(
    std::unique_ptr<StageWork> inner, double factor) {
  if (inner == nullptr) return absl::InvalidArgumentError("SlowStageWork needs a stage work");
  if (!(factor >= 1) || !std::isfinite(factor)) {
    return absl::InvalidArgumentError(
        absl::StrCat("a slow-down factor must be a finite number >= 1, not ", factor));
  }
  return std::unique_ptr<SlowStageWork>(new SlowStageWork(std::move(inner), factor));
}

template <typename Fn>
absl::Status SlowStageWork::Stretched(runtime::Stream& stream, Fn&& enqueue_work) {
  if (factor_ == 1) return enqueue_work();
  using Clock = std::chrono::steady_clock;
  // Written by the first host function, read by the second; both run on the stream in
  // order, so no lock is needed.
  auto started = std::make_shared<Clock::time_point>();
  PS_RETURN_IF_ERROR(stream.EnqueueHost([started] {
    *started = Clock::now();
    return absl::OkStatus();
  }));
  PS_RETURN_IF_ERROR(enqueue_work());
  const double extra = factor_ - 1;
  return stream.EnqueueHost([started, extra] {
    const Clock::time_point now = Clock::now();
    const auto took = std::chrono::duration<double>(now - *started);
    const Clock::time_point until = now + std::chrono::duration_cast<Clock::duration>(took * extra);
    // Sleep, then spin the last stretch: a sleep alone overshoots by the wake-up latency.
    const auto spin = std::chrono::microseconds(100);
    if (until - now > spin) std::this_thread::sleep_until(until - spin);
    while (Clock::now() < until) std::this_thread::yield();
    return absl::OkStatus();
  });
}

absl::Status SlowStageWork::Forward(const MicrobatchIO& io, runtime::Stream& stream) {
  return Stretched(stream, [&] { return inner_->Forward(io, stream); });
}

absl::Status SlowStageWork::Backward(const MicrobatchIO& io, runtime::Stream& stream) {
  return Stretched(stream, [&] { return inner_->Backward(io, stream); });
}

absl::Status SlowStageWork::BackwardInput(const MicrobatchIO& io, runtime::Stream& stream) {
  return Stretched(stream, [&] { return inner_->BackwardInput(io, stream); });
}

absl::Status SlowStageWork::BackwardWeight(const MicrobatchIO& io, runtime::Stream& stream) {
  return Stretched(stream, [&] { return inner_->BackwardWeight(io, stream); });
}

}  // namespace pipesched::stages
