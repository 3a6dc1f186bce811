// The CUDA backend against the host one: every shared scenario runs on both and must give
// the same observable result. Skips (through tests/testing/gpu.h) without a usable GPU.
#include <chrono>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "pipesched/runtime/runtime.h"
#include "runtime_scenarios.h"
#include "testing/gpu.h"
#include "testing/status_matchers.h"

namespace pipesched::runtime {
namespace {

using ::pipesched::testing::StatusIs;
using ::testing::AllOf;
using ::testing::ElementsAre;
using ::testing::HasSubstr;

class CudaVsHost : public ::testing::Test {
 protected:
  void SetUp() override {
    PS_SKIP_IF_NO_GPU();
    const int gpus = CudaDeviceCount();
    num_devices_ = gpus >= 2 ? 2 : 1;
    cuda_ = scenarios::MustCreate(BackendKind::kCuda, num_devices_, /*strict=*/true);
    host_ = scenarios::MustCreate(BackendKind::kHost, num_devices_, /*strict=*/true);
    ASSERT_NE(cuda_, nullptr);
    ASSERT_NE(host_, nullptr);
  }
  Device& cuda(int i) { return cuda_->device(i); }
  Device& host(int i) { return host_->device(i); }
  int last() const { return num_devices_ - 1; }

  int num_devices_ = 1;
  std::unique_ptr<Backend> cuda_;
  std::unique_ptr<Backend> host_;
};

TEST_F(CudaVsHost, DescribesItsDevices) {
  EXPECT_EQ(cuda_->kind(), BackendKind::kCuda);
  EXPECT_THAT(cuda(0).description(), HasSubstr("cuda:0 ("));
  PS_ASSERT_OK_AND_ASSIGN(auto stream, cuda(0).CreateStream("s"));
  EXPECT_NE(stream->native_handle(), nullptr);
}

TEST_F(CudaVsHost, OrderWithinStream) {
  PS_ASSERT_OK_AND_ASSIGN(auto on_cuda, scenarios::OrderWithinStream(cuda(0)));
  PS_ASSERT_OK_AND_ASSIGN(auto on_host, scenarios::OrderWithinStream(host(0)));
  EXPECT_EQ(on_cuda, on_host);
}

TEST_F(CudaVsHost, CrossStreamWait) {
  PS_ASSERT_OK_AND_ASSIGN(auto on_cuda, scenarios::CrossStreamWait(cuda(0), cuda(last())));
  PS_ASSERT_OK_AND_ASSIGN(auto on_host, scenarios::CrossStreamWait(host(0), host(last())));
  EXPECT_THAT(on_cuda, ElementsAre("a", "b"));
  EXPECT_EQ(on_cuda, on_host);
}

TEST_F(CudaVsHost, WaitCapturesLatestRecord) {
  PS_ASSERT_OK_AND_ASSIGN(auto on_cuda, scenarios::WaitCapturesLatestRecord(cuda(0)));
  PS_ASSERT_OK_AND_ASSIGN(auto on_host, scenarios::WaitCapturesLatestRecord(host(0)));
  EXPECT_THAT(on_cuda, ElementsAre("a1", "b", "a2"));
  EXPECT_EQ(on_cuda, on_host);
}

TEST_F(CudaVsHost, StrictWaitOnNeverRecordedEvent) {
  PS_ASSERT_OK_AND_ASSIGN(auto on_cuda, scenarios::WaitOnNeverRecorded(cuda(0)));
  PS_ASSERT_OK_AND_ASSIGN(auto on_host, scenarios::WaitOnNeverRecorded(host(0)));
  EXPECT_THAT(on_cuda.wait, StatusIs(absl::StatusCode::kFailedPrecondition,
                                     AllOf(HasSubstr("stream 'waiter' on cuda:0"),
                                           HasSubstr("event 'F(0,0) done'"))));
  EXPECT_EQ(on_cuda.wait.code(), on_host.wait.code());
  EXPECT_EQ(on_cuda.log, on_host.log);
}

TEST_F(CudaVsHost, NonStrictWaitOnNeverRecordedEventIsANoOp) {
  auto cuda = scenarios::MustCreate(BackendKind::kCuda, 1, /*strict=*/false);
  ASSERT_NE(cuda, nullptr);
  PS_ASSERT_OK_AND_ASSIGN(auto on_cuda, scenarios::WaitOnNeverRecorded(cuda->device(0)));
  PS_EXPECT_OK(on_cuda.wait);
  EXPECT_THAT(on_cuda.log, ElementsAre("after"));
}

TEST_F(CudaVsHost, QueryAndSynchronize) {
  PS_ASSERT_OK_AND_ASSIGN(auto on_cuda, scenarios::QueryAndSynchronize(cuda(0)));
  PS_ASSERT_OK_AND_ASSIGN(auto on_host, scenarios::QueryAndSynchronize(host(0)));
  EXPECT_THAT(on_cuda, ElementsAre(true, false, true));
  EXPECT_EQ(on_cuda, on_host);
}

TEST_F(CudaVsHost, Timing) {
  PS_ASSERT_OK_AND_ASSIGN(auto on_cuda, scenarios::Timing(cuda(0)));
  PS_ASSERT_OK_AND_ASSIGN(auto on_host, scenarios::Timing(host(0)));
  // The GPU busy-wait is exact to a few microseconds; the host one overshoots a little.
  EXPECT_NEAR(on_cuda.elapsed_ms, 20.0, 1.0);
  EXPECT_NEAR(on_host.elapsed_ms, 20.0, 5.0);
  EXPECT_GE(on_cuda.start_us, 0);
  EXPECT_NEAR(on_cuda.end_us - on_cuda.start_us, on_cuda.elapsed_ms * 1000, 5.0);
}

TEST_F(CudaVsHost, TimestampsKeepTheirPlaceWhenTheAnchorIsReplaced) {
  // An event's timestamp read against the device's first timestamp anchor, and again
  // after the anchor aged past its limit (4 s) and was replaced, must agree to the
  // host/device clock sync error (a few microseconds per anchor); and a 1 ms interval
  // read after the replacement stays exact (CUDA's own elapsed time is the truth).
  PS_ASSERT_OK_AND_ASSIGN(auto stream, cuda(0).CreateStream("s"));
  PS_ASSERT_OK_AND_ASSIGN(auto a, cuda(0).CreateEvent(true, "a"));
  PS_ASSERT_OK_AND_ASSIGN(auto b, cuda(0).CreateEvent(true, "b"));
  // Warm-up: the busy-wait kernel's first launch in this process loads its module
  // (lazy loading), which must not fall between a and b.
  PS_ASSERT_OK(stream->EnqueueBusyWait(1));
  PS_ASSERT_OK(stream->Synchronize());
  PS_ASSERT_OK(a->Record(*stream));
  PS_ASSERT_OK(stream->EnqueueBusyWait(1000));
  PS_ASSERT_OK(b->Record(*stream));
  PS_ASSERT_OK(stream->Synchronize());
  PS_ASSERT_OK_AND_ASSIGN(double before, a->TimestampMicros());
  std::this_thread::sleep_for(std::chrono::milliseconds(4500));
  PS_ASSERT_OK_AND_ASSIGN(double after, a->TimestampMicros());
  PS_ASSERT_OK_AND_ASSIGN(double b_after, b->TimestampMicros());
  PS_ASSERT_OK_AND_ASSIGN(double elapsed_ms, b->ElapsedMillis(*a));
  // The new anchor's sync error, plus the clocks' drift over 4.5 s (~10 ppm = 45 us).
  EXPECT_NEAR(after, before, 200);
  EXPECT_NEAR(b_after - after, elapsed_ms * 1000, 2);
  EXPECT_NEAR(elapsed_ms * 1000, 1000, 50);  // the busy wait, plus its launch
}

TEST_F(CudaVsHost, TimestampsOfTwoDevicesShareOneAxis) {
  if (num_devices_ < 2) GTEST_SKIP() << "needs 2 GPUs";
  // Both devices record after their streams are idle at about the same host time.
  PS_ASSERT_OK_AND_ASSIGN(auto s0, cuda(0).CreateStream("s0"));
  PS_ASSERT_OK_AND_ASSIGN(auto s1, cuda(1).CreateStream("s1"));
  PS_ASSERT_OK_AND_ASSIGN(auto e0, cuda(0).CreateEvent(true));
  PS_ASSERT_OK_AND_ASSIGN(auto e1, cuda(1).CreateEvent(true));
  PS_ASSERT_OK(e0->Record(*s0));
  PS_ASSERT_OK(e1->Record(*s1));
  PS_ASSERT_OK(s0->Synchronize());
  PS_ASSERT_OK(s1->Synchronize());
  PS_ASSERT_OK_AND_ASSIGN(double t0, e0->TimestampMicros());
  PS_ASSERT_OK_AND_ASSIGN(double t1, e1->TimestampMicros());
  EXPECT_NEAR(t0, t1, 500);
}

TEST_F(CudaVsHost, StreamsOverlap) {
  PS_ASSERT_OK_AND_ASSIGN(double on_cuda, scenarios::OverlapWallMillis(cuda(0), cuda(last())));
  PS_ASSERT_OK_AND_ASSIGN(double on_host, scenarios::OverlapWallMillis(host(0), host(last())));
  EXPECT_LT(on_cuda, 95);
  EXPECT_LT(on_host, 95);
}

TEST_F(CudaVsHost, StreamOrderedMemory) {
  PS_ASSERT_OK_AND_ASSIGN(auto on_cuda, scenarios::StreamOrderedMemory(cuda(0)));
  PS_ASSERT_OK_AND_ASSIGN(auto on_host, scenarios::StreamOrderedMemory(host(0)));
  EXPECT_THAT(on_cuda.current, ElementsAre(1000, 4000, 4000, 3000, 3500, 0));
  EXPECT_EQ(on_cuda.current, on_host.current);
  EXPECT_EQ(on_cuda.peak, on_host.peak);
}

TEST_F(CudaVsHost, CapacityError) {
  auto cuda = scenarios::MustCreate(BackendKind::kCuda, 1, true, /*capacity=*/1 << 20);
  ASSERT_NE(cuda, nullptr);
  PS_ASSERT_OK_AND_ASSIGN(auto stream, cuda->device(0).CreateStream("s"));
  PS_ASSERT_OK_AND_ASSIGN(Buffer first, cuda->device(0).Allocate(600 << 10, *stream));
  EXPECT_THAT(cuda->device(0).Allocate(600 << 10, *stream),
              StatusIs(absl::StatusCode::kResourceExhausted,
                       AllOf(HasSubstr("cuda:0"), HasSubstr("cannot allocate 614400 bytes"),
                             HasSubstr("434176 bytes free"))));
  PS_ASSERT_OK(first.FreeAsync(*stream));
  PS_ASSERT_OK(stream->Synchronize());
}

TEST_F(CudaVsHost, RealOutOfMemoryIsResourceExhausted) {
  PS_ASSERT_OK_AND_ASSIGN(auto stream, cuda(0).CreateStream("s"));
  // 1 TiB: more than any GPU has, yet inside its address space (a size beyond that
  // might be rejected as an invalid value instead).
  EXPECT_THAT(cuda(0).Allocate(std::size_t{1} << 40, *stream),
              StatusIs(absl::StatusCode::kResourceExhausted,
                       AllOf(HasSubstr("cuda:0"), HasSubstr("bytes free"))));
  PS_EXPECT_OK(stream->Synchronize());
}

TEST_F(CudaVsHost, CopyAcrossDevices) {
  PS_ASSERT_OK_AND_ASSIGN(auto on_cuda, scenarios::CopyAcrossDevices(cuda(0), cuda(last())));
  PS_ASSERT_OK_AND_ASSIGN(auto on_host, scenarios::CopyAcrossDevices(host(0), host(last())));
  EXPECT_EQ(on_cuda, on_host);
}

TEST_F(CudaVsHost, PoisonedStream) {
  PS_ASSERT_OK_AND_ASSIGN(auto on_cuda, scenarios::PoisonedStream(cuda(0)));
  PS_ASSERT_OK_AND_ASSIGN(auto on_host, scenarios::PoisonedStream(host(0)));
  EXPECT_THAT(on_cuda.log, ElementsAre("before"));
  EXPECT_EQ(on_cuda.log, on_host.log);
  EXPECT_THAT(on_cuda.synchronize,
              StatusIs(absl::StatusCode::kDataLoss, HasSubstr("stream 'stage1' on cuda:0")));
  EXPECT_EQ(on_cuda.later_enqueue.code(), absl::StatusCode::kDataLoss);
  EXPECT_TRUE(on_cuda.event_completed);
}

TEST_F(CudaVsHost, RecordOnAnotherDevicesStreamIsRejected) {
  if (num_devices_ < 2) GTEST_SKIP() << "needs 2 GPUs";
  PS_ASSERT_OK_AND_ASSIGN(auto stream, cuda(1).CreateStream("s1"));
  PS_ASSERT_OK_AND_ASSIGN(auto event, cuda(0).CreateEvent(false, "e0"));
  EXPECT_THAT(event->Record(*stream),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("'e0' belongs to cuda:0")));
}

TEST_F(CudaVsHost, MixingBackendsIsRejected) {
  PS_ASSERT_OK_AND_ASSIGN(auto cuda_stream, cuda(0).CreateStream("c"));
  PS_ASSERT_OK_AND_ASSIGN(auto host_event, host(0).CreateEvent(false, "h"));
  EXPECT_THAT(cuda_stream->Wait(*host_event),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("not a")));
  EXPECT_THAT(host_event->Record(*cuda_stream),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("not a")));
}

// Last in this file: it leaves device 0 abandoned for the rest of the process (ctest runs
// each test in a process of its own; the whole binary run at once runs it last).
TEST(CudaRuntime, AbandonedHostFunctionHoldsNeitherFreesNorTheBackend) {
  PS_SKIP_IF_NO_GPU();
  PS_ASSERT_OK_AND_ASSIGN(scenarios::AbandonedResult r,
                          scenarios::AbandonedHostFunction(BackendKind::kCuda));
  EXPECT_EQ(scenarios::AbandonedProblems(r), "");
}

}  // namespace
}  // namespace pipesched::runtime
