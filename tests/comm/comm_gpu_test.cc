// comm/ on one GPU: the CUDA peer transport (a copy within the GPU, its argument checks,
// a poisoned stream) and the NCCL all-reducer's paths that need no second GPU (one
// participant, replicas sharing the GPU, misuse, abort), and NCCL itself in a one-rank
// communicator. Labelled gpu; skips through PS_SKIP_IF_NO_GPU without a usable GPU.
#include <memory>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "pipesched/comm/all_reduce.h"
#include "pipesched/comm/transport.h"
#include "pipesched/runtime/runtime.h"
#include "testing/gpu.h"
#include "testing/status_matchers.h"

#ifdef PIPESCHED_HAS_CUDA
#include <nccl.h>

#include "pipesched/runtime/cuda_runtime.h"
#endif

namespace pipesched::comm {
namespace {

using ::pipesched::testing::StatusIs;
using ::testing::HasSubstr;

class CommGpuTest : public ::testing::Test {
 protected:
  void SetUp() override {
    PS_SKIP_IF_NO_GPU();
    PS_ASSERT_OK_AND_ASSIGN(
        backend_, runtime::CreateBackend(
                      {.kind = runtime::BackendKind::kCuda, .num_devices = 1, .strict = true}));
  }
  void TearDown() override {
    for (auto& s : streams_) (void)s->Synchronize();
    buffers_.clear();
    streams_.clear();
  }

  runtime::Device& gpu() { return backend_->device(0); }
  runtime::Stream& NewStream(const char* name) {
    streams_.push_back(gpu().CreateStream(name).value());
    return *streams_.back();
  }
  // A device copy of `host`, allocated on `stream` and uploaded once the allocation is done.
  float* Upload(const std::vector<float>& host, runtime::Stream& stream) {
    absl::StatusOr<runtime::Buffer> b = gpu().Allocate(sizeof(float) * host.size(), stream);
    EXPECT_TRUE(b.ok()) << b.status();
    EXPECT_TRUE(stream.Synchronize().ok());
    EXPECT_TRUE(gpu().CopyFromHost(b->data(), host.data(), sizeof(float) * host.size()).ok());
    buffers_.push_back(std::move(*b));
    return buffers_.back().as<float>();
  }
  std::vector<float> Download(const float* dev, std::size_t n) {
    std::vector<float> out(n);
    EXPECT_TRUE(gpu().CopyToHost(out.data(), dev, sizeof(float) * n).ok());
    return out;
  }

  std::unique_ptr<runtime::Backend> backend_;
  std::vector<std::unique_ptr<runtime::Stream>> streams_;
  std::vector<runtime::Buffer> buffers_;
};

std::vector<float> Ramp(int n, float scale, float offset) {
  std::vector<float> v(n);
  for (int k = 0; k < n; ++k) v[k] = scale * static_cast<float>(k) + offset;
  return v;
}

TEST_F(CommGpuTest, PeerTransportCopiesWithinOneGpu) {
  constexpr int kN = 1000;
  runtime::Stream& s = NewStream("transfer");
  float* src = Upload(Ramp(kN, 0.5f, 1.0f), s);
  float* dst = Upload(std::vector<float>(kN, -7.0f), s);
  PS_ASSERT_OK_AND_ASSIGN(auto transport, CreateTransport(runtime::BackendKind::kCuda));
  EXPECT_EQ(transport->name(), "cuda-peer");
  PS_ASSERT_OK(transport->Move({.device = &gpu(), .stream = &s, .data = src},
                               {.device = &gpu(), .stream = &s, .data = dst}, kN * sizeof(float),
                               s));
  PS_ASSERT_OK(s.Synchronize());
  EXPECT_EQ(Download(dst, kN), Ramp(kN, 0.5f, 1.0f));
}

TEST_F(CommGpuTest, PeerTransportRejectsAHostEndpoint) {
  auto host = runtime::CreateBackend({.kind = runtime::BackendKind::kHost}).value();
  runtime::Stream& s = NewStream("transfer");
  PS_ASSERT_OK_AND_ASSIGN(auto transport, CreateTransport(runtime::BackendKind::kCuda));
  int word = 0;
  EXPECT_THAT(transport->Move({.device = &host->device(0), .data = &word},
                              {.device = &gpu(), .data = &word}, sizeof(word), s),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("from host:0 to cuda:0")));
}

TEST_F(CommGpuTest, PeerTransportReturnsThePoisonedStreamsError) {
  runtime::Stream& s = NewStream("transfer");
  float* src = Upload(std::vector<float>(4, 1.0f), s);
  float* dst = Upload(std::vector<float>(4, 0.0f), s);
  PS_ASSERT_OK(s.EnqueueHost([] { return absl::DataLossError("boom"); }));
  EXPECT_THAT(s.Synchronize(), StatusIs(absl::StatusCode::kDataLoss, HasSubstr("boom")));
  PS_ASSERT_OK_AND_ASSIGN(auto transport, CreateTransport(runtime::BackendKind::kCuda));
  EXPECT_THAT(transport->Move({.device = &gpu(), .data = src}, {.device = &gpu(), .data = dst},
                              4 * sizeof(float), s),
              StatusIs(absl::StatusCode::kDataLoss, HasSubstr("'transfer'")));
}

TEST_F(CommGpuTest, OneParticipantLeavesItsBufferAsItIs) {
  constexpr int kN = 300;
  runtime::Stream& s = NewStream("comm");
  float* data = Upload(Ramp(kN, 1.5f, -2.0f), s);
  PS_ASSERT_OK_AND_ASSIGN(auto reducer, CreateAllReducer({&gpu()}));
  EXPECT_EQ(reducer->size(), 1);
  const ReducePart part = {.data = data, .stream = &s};
  PS_ASSERT_OK(reducer->AllReduceAverage({&part, 1}, kN));
  PS_ASSERT_OK(reducer->AllReduceAverage({&part, 1}, 0));
  PS_ASSERT_OK(reducer->AsyncError());
  PS_ASSERT_OK(s.Synchronize());
  EXPECT_EQ(Download(data, kN), Ramp(kN, 1.5f, -2.0f));
}

TEST_F(CommGpuTest, ReplicasSharingTheGpuAverageLocally) {
  constexpr int kN = 1000;
  runtime::Stream& s0 = NewStream("comm0");
  runtime::Stream& s1 = NewStream("comm1");
  float* a = Upload(Ramp(kN, 1.0f, 0.0f), s0);
  float* b = Upload(Ramp(kN, 3.0f, 1.0f), s1);
  PS_ASSERT_OK_AND_ASSIGN(auto reducer, CreateAllReducer({&gpu(), &gpu()}));
  EXPECT_EQ(reducer->name(), "local");
  // Replica 1 arrives late: replica 0's stream must not pass its part before.
  PS_ASSERT_OK(s1.EnqueueBusyWait(2000));
  const std::vector<ReducePart> parts = {{.data = a, .stream = &s0}, {.data = b, .stream = &s1}};
  PS_ASSERT_OK(reducer->AllReduceAverage(parts, kN));
  PS_ASSERT_OK(s0.Synchronize());
  PS_ASSERT_OK(s1.Synchronize());
  const std::vector<float> mean = Ramp(kN, 2.0f, 0.5f);  // exact in float
  EXPECT_EQ(Download(a, kN), mean);
  EXPECT_EQ(Download(b, kN), mean);
}

TEST_F(CommGpuTest, AllReduceMisuseIsInvalidArgument) {
  runtime::Stream& s0 = NewStream("comm0");
  runtime::Stream& s1 = NewStream("comm1");
  float* a = Upload(std::vector<float>(4, 1.0f), s0);
  float* b = Upload(std::vector<float>(4, 2.0f), s1);
  PS_ASSERT_OK_AND_ASSIGN(auto reducer, CreateAllReducer({&gpu(), &gpu()}));
  auto reduce = [&](ReducePart p0, ReducePart p1) {
    const std::vector<ReducePart> parts = {p0, p1};
    return reducer->AllReduceAverage(parts, 4);
  };
  EXPECT_THAT(reduce({.data = a, .stream = &s0}, {.data = b, .stream = nullptr}),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("part 1 without stream")));
  EXPECT_THAT(reduce({.data = nullptr, .stream = &s0}, {.data = b, .stream = &s1}),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("part 0 without")));
  auto host = runtime::CreateBackend({.kind = runtime::BackendKind::kHost}).value();
  PS_ASSERT_OK_AND_ASSIGN(auto host_stream, host->device(0).CreateStream("host-comm"));
  EXPECT_THAT(reduce({.data = a, .stream = &s0}, {.data = b, .stream = host_stream.get()}),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("stream 'host-comm' is on host:0, not on participant 1's")));
  const std::vector<ReducePart> one = {{.data = a, .stream = &s0}};
  EXPECT_THAT(reducer->AllReduceAverage(one, 4),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("given 1 parts")));
}

TEST_F(CommGpuTest, AbortedReducerIsCancelled) {
  runtime::Stream& s0 = NewStream("comm0");
  runtime::Stream& s1 = NewStream("comm1");
  float* a = Upload(std::vector<float>(4, 1.0f), s0);
  float* b = Upload(std::vector<float>(4, 2.0f), s1);
  PS_ASSERT_OK_AND_ASSIGN(auto reducer, CreateAllReducer({&gpu(), &gpu()}));
  reducer->Abort();
  const std::vector<ReducePart> parts = {{.data = a, .stream = &s0}, {.data = b, .stream = &s1}};
  EXPECT_THAT(reducer->AllReduceAverage(parts, 4),
              StatusIs(absl::StatusCode::kCancelled, HasSubstr("aborted")));
  PS_EXPECT_OK(reducer->AsyncError());
}

#ifdef PIPESCHED_HAS_CUDA
// NCCL itself on this GPU. On one GPU the reducer never makes a communicator (replicas
// sharing a GPU reduce locally), so without this test a one-GPU machine would never show
// that NCCL loads, initialises a communicator and runs a collective on our stream.
TEST_F(CommGpuTest, NcclRunsACollectiveOnOneGpu) {
  constexpr int kN = 1000;
  runtime::Stream& s = NewStream("nccl");
  const float* send = Upload(Ramp(kN, 0.5f, 3.0f), s);
  float* recv = Upload(std::vector<float>(kN, -1.0f), s);
  ncclComm_t raw = nullptr;
  int gpu_index = gpu().index();
  const ncclResult_t init = ncclCommInitAll(&raw, 1, &gpu_index);
  ASSERT_EQ(init, ncclSuccess) << ncclGetErrorString(init);
  std::unique_ptr<ncclComm, ncclResult_t (*)(ncclComm_t)> comm(raw, &ncclCommDestroy);
  int version = 0;
  ASSERT_EQ(ncclGetVersion(&version), ncclSuccess);
  RecordProperty("nccl_version", version);
  // Out of place, so that the result can only have come from NCCL.
  const ncclResult_t reduce = ncclAllReduce(send, recv, kN, ncclFloat, ncclAvg, comm.get(),
                                            runtime::UncheckedCudaStream(s));
  ASSERT_EQ(reduce, ncclSuccess) << ncclGetErrorString(reduce);
  PS_ASSERT_OK(s.Synchronize());
  ncclResult_t async = ncclInternalError;
  ASSERT_EQ(ncclCommGetAsyncError(comm.get(), &async), ncclSuccess);
  EXPECT_EQ(async, ncclSuccess) << ncclGetErrorString(async);
  EXPECT_EQ(Download(recv, kN), Ramp(kN, 0.5f, 3.0f));
}
#endif

}  // namespace
}  // namespace pipesched::comm
