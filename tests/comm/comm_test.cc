// comm/ on the host backend: a transfer lands in stream order on the destination's
// stream; the in-process all-reduce averages across replicas with NCCL's semantics (no
// participant's stream proceeds past its part before the reduction is done), calls
// stay ordered, and misuse is an error.
#include <atomic>
#include <memory>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "pipesched/comm/all_reduce.h"
#include "pipesched/comm/transport.h"
#include "pipesched/runtime/runtime.h"
#include "pipesched/version.h"
#include "testing/status_matchers.h"

namespace pipesched::comm {
namespace {

using ::pipesched::testing::StatusIs;
using ::testing::HasSubstr;

std::unique_ptr<runtime::Backend> HostBackend(int devices) {
  auto backend = runtime::CreateBackend(
      {.kind = runtime::BackendKind::kHost, .num_devices = devices, .strict = true});
  EXPECT_TRUE(backend.ok()) << backend.status();
  return std::move(backend).value();
}

TEST(TransportTest, HostCopyLandsOnTheDestinationStream) {
  auto backend = HostBackend(2);
  runtime::Device& a = backend->device(0);
  runtime::Device& b = backend->device(1);
  PS_ASSERT_OK_AND_ASSIGN(auto sa, a.CreateStream("send"));
  PS_ASSERT_OK_AND_ASSIGN(auto sb, b.CreateStream("recv"));
  PS_ASSERT_OK_AND_ASSIGN(auto transport, CreateTransport(runtime::BackendKind::kHost));
  EXPECT_EQ(transport->name(), "host-copy");
  EXPECT_FALSE(transport->two_sided());

  constexpr int kN = 1000;
  PS_ASSERT_OK_AND_ASSIGN(runtime::Buffer src, a.Allocate(kN * sizeof(float), *sa));
  PS_ASSERT_OK_AND_ASSIGN(runtime::Buffer dst, b.Allocate(kN * sizeof(float), *sb));
  // The producer writes src on a's stream after a delay; b's stream waits for it.
  PS_ASSERT_OK(sa->EnqueueBusyWait(2000));
  float* s = src.as<float>();
  PS_ASSERT_OK(sa->EnqueueHost([s] {
    for (int i = 0; i < kN; ++i) s[i] = 0.5f * i + 1;
    return absl::OkStatus();
  }));
  PS_ASSERT_OK_AND_ASSIGN(auto written, a.CreateEvent(false, "written"));
  PS_ASSERT_OK(written->Record(*sa));
  std::vector<float> poison(kN, -7.0f);
  PS_ASSERT_OK(b.CopyFromHost(dst.data(), poison.data(), kN * sizeof(float)));
  PS_ASSERT_OK(sb->Wait(*written));
  PS_ASSERT_OK(transport->Move({.device = &a, .stream = sa.get(), .data = src.data()},
                               {.device = &b, .stream = sb.get(), .data = dst.data()},
                               kN * sizeof(float), *sb));
  PS_ASSERT_OK(sb->Synchronize());
  std::vector<float> got(kN);
  PS_ASSERT_OK(b.CopyToHost(got.data(), dst.data(), kN * sizeof(float)));
  for (int i = 0; i < kN; ++i) ASSERT_EQ(got[i], 0.5f * i + 1) << "at " << i;
  PS_ASSERT_OK(src.FreeAsync(*sa));
  PS_ASSERT_OK(dst.FreeAsync(*sb));
  PS_ASSERT_OK(sa->Synchronize());
  PS_ASSERT_OK(sb->Synchronize());
}

TEST(TransportTest, MissingEndpointIsAnError) {
  auto transport = CreateDeviceCopyTransport();
  auto backend = HostBackend(1);
  PS_ASSERT_OK_AND_ASSIGN(auto stream, backend->device(0).CreateStream("s"));
  EXPECT_THAT(transport->Move({}, {}, 4, *stream),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("endpoint")));
}

// D participants on D devices, each with its own comm stream.
struct Replicas {
  std::unique_ptr<runtime::Backend> backend;
  std::vector<std::unique_ptr<runtime::Stream>> streams;
  std::vector<runtime::Buffer> buffers;
  std::vector<runtime::Device*> devices;
};

Replicas MakeReplicas(int d, int count) {
  Replicas r;
  r.backend = HostBackend(d);
  for (int i = 0; i < d; ++i) {
    runtime::Device& device = r.backend->device(i);
    r.devices.push_back(&device);
    r.streams.push_back(device.CreateStream("comm").value());
    r.buffers.push_back(device.Allocate(count * sizeof(float), *r.streams.back()).value());
  }
  return r;
}

TEST(HostAllReduceTest, AveragesAndHoldsEveryStreamUntilDone) {
  constexpr int kD = 3;
  constexpr int kCount = 257;
  Replicas r = MakeReplicas(kD, kCount);
  PS_ASSERT_OK_AND_ASSIGN(auto reducer, CreateAllReducer(r.devices));
  EXPECT_EQ(reducer->name(), "host");
  EXPECT_EQ(reducer->size(), kD);

  std::vector<ReducePart> parts;
  for (int i = 0; i < kD; ++i) {
    std::vector<float> init(kCount);
    for (int k = 0; k < kCount; ++k) init[k] = static_cast<float>((i + 1) * k) - 3.0f * i;
    PS_ASSERT_OK(
        r.devices[i]->CopyFromHost(r.buffers[i].data(), init.data(), kCount * sizeof(float)));
    parts.push_back({.data = r.buffers[i].as<float>(), .stream = r.streams[i].get()});
  }
  // Replica 2 arrives last, late: the others must not run past their part before.
  PS_ASSERT_OK(r.streams[2]->EnqueueBusyWait(20000));
  PS_ASSERT_OK(reducer->AllReduceAverage(parts, kCount));
  std::vector<std::atomic<float>> seen(kD);
  for (int i = 0; i < kD; ++i) {
    float* data = r.buffers[i].as<float>();
    std::atomic<float>* out = &seen[i];
    PS_ASSERT_OK(r.streams[i]->EnqueueHost([data, out] {
      out->store(data[10]);
      return absl::OkStatus();
    }));
  }
  for (auto& s : r.streams) PS_ASSERT_OK(s->Synchronize());
  for (int i = 0; i < kD; ++i) {
    EXPECT_FLOAT_EQ(seen[i].load(), (10.0f * (1 + 2 + 3) - 3.0f * (0 + 1 + 2)) / 3.0f);
    std::vector<float> got(kCount);
    PS_ASSERT_OK(r.devices[i]->CopyToHost(got.data(), r.buffers[i].data(), kCount * sizeof(float)));
    for (int k = 0; k < kCount; ++k) {
      const float want = (static_cast<float>(6 * k) - 9.0f) / 3.0f;
      ASSERT_NEAR(got[k], want, 1e-5f * (1 + std::abs(want))) << "replica " << i << " at " << k;
    }
  }
}

TEST(HostAllReduceTest, ConsecutiveCallsStayOrdered) {
  constexpr int kD = 2;
  Replicas r = MakeReplicas(kD, 4);
  PS_ASSERT_OK_AND_ASSIGN(auto reducer, CreateAllReducer(r.devices));
  std::vector<ReducePart> parts;
  for (int i = 0; i < kD; ++i) {
    std::vector<float> init = {1.0f * i, 2.0f * i, 0, 0};
    PS_ASSERT_OK(r.devices[i]->CopyFromHost(r.buffers[i].data(), init.data(), 16));
    parts.push_back({.data = r.buffers[i].as<float>(), .stream = r.streams[i].get()});
  }
  // Between the two reductions each replica adds its index + 1: mean(x)+1.5 after both.
  PS_ASSERT_OK(reducer->AllReduceAverage(parts, 4));
  for (int i = 0; i < kD; ++i) {
    float* data = r.buffers[i].as<float>();
    PS_ASSERT_OK(r.streams[i]->EnqueueHost([data, i] {
      for (int k = 0; k < 4; ++k) data[k] += static_cast<float>(i + 1);
      return absl::OkStatus();
    }));
  }
  PS_ASSERT_OK(reducer->AllReduceAverage(parts, 4));
  for (auto& s : r.streams) PS_ASSERT_OK(s->Synchronize());
  for (int i = 0; i < kD; ++i) {
    std::vector<float> got(4);
    PS_ASSERT_OK(r.devices[i]->CopyToHost(got.data(), r.buffers[i].data(), 16));
    EXPECT_FLOAT_EQ(got[0], 0.5f + 1.5f);
    EXPECT_FLOAT_EQ(got[1], 1.0f + 1.5f);
    EXPECT_FLOAT_EQ(got[2], 1.5f);
  }
}

TEST(HostAllReduceTest, MisuseIsAnError) {
  EXPECT_THAT(CreateAllReducer({}),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("at least one")));
  Replicas r = MakeReplicas(2, 4);
  PS_ASSERT_OK_AND_ASSIGN(auto reducer, CreateAllReducer(r.devices));
  std::vector<ReducePart> one = {{.data = r.buffers[0].as<float>(), .stream = r.streams[0].get()}};
  EXPECT_THAT(reducer->AllReduceAverage(one, 4),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("given 1 parts")));
}

TEST(CudaCommTest, UnavailableWithoutCuda) {
  if (runtime::CudaAvailable()) GTEST_SKIP() << "a GPU is usable here";
#if !PIPESCHED_HAS_CUDA  // from pipesched/version.h: 0 or 1
  EXPECT_THAT(CreateTransport(runtime::BackendKind::kCuda),
              StatusIs(absl::StatusCode::kUnavailable, HasSubstr("without CUDA")));
#endif
}

}  // namespace
}  // namespace pipesched::comm
