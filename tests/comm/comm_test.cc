// comm/ on the host backend: a transfer lands in stream order on the destination's
// stream; the in-process all-reduce averages across replicas with NCCL's semantics (no
// participant's stream proceeds past its part before the reduction is done), calls
// stay ordered, and misuse is an error.
#include <unistd.h>

#include <atomic>
#include <filesystem>
#include <memory>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "pipesched/comm/all_reduce.h"
#include "pipesched/comm/bootstrap.h"
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

// A timeout past 30 years is none: the reduction waits for the late participant rather
// than giving up at once (its duration would overflow the clock).
TEST(HostAllReduceTest, AHugeTimeoutIsNone) {
  Replicas r = MakeReplicas(2, 4);
  PS_ASSERT_OK_AND_ASSIGN(auto reducer, CreateAllReducer(r.devices, {.timeout_seconds = 1e10}));
  std::vector<ReducePart> parts;
  for (int i = 0; i < 2; ++i) {
    const std::vector<float> init(4, static_cast<float>(i));
    PS_ASSERT_OK(r.devices[i]->CopyFromHost(r.buffers[i].data(), init.data(), 4 * sizeof(float)));
    parts.push_back({.data = r.buffers[i].as<float>(), .stream = r.streams[i].get()});
  }
  PS_ASSERT_OK(r.streams[1]->EnqueueBusyWait(20000));
  PS_ASSERT_OK(reducer->AllReduceAverage(parts, 4));
  for (auto& s : r.streams) PS_ASSERT_OK(s->Synchronize());
  std::vector<float> got(4);
  PS_ASSERT_OK(r.devices[0]->CopyToHost(got.data(), r.buffers[0].data(), 4 * sizeof(float)));
  EXPECT_EQ(got[3], 0.5f);
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

// Inputs of mixed magnitudes, so that a different summation order changes the bits.
std::vector<float> MixedInput(int participant, int count) {
  std::vector<float> v(count);
  for (int k = 0; k < count; ++k) {
    const float scale = (k + participant) % 3 == 0 ? 1e6f : ((k % 5 == 0) ? 1e-3f : 1.0f);
    v[k] = scale * (static_cast<float>((participant * 7919 + k * 104729) % 1000) / 997.0f - 0.5f);
  }
  return v;
}

// Runs one all-reduce of MixedInput over `per_process` participants in each of the
// processes (threads here, each with its own host backend and bootstrap rank) and
// returns every participant's result, process rank major.
std::vector<std::vector<float>> ReduceAcrossProcesses(
    std::vector<std::unique_ptr<Bootstrap>>& processes, int per_process, int count) {
  const int num = static_cast<int>(processes.size());
  std::vector<std::vector<float>> out(num * per_process);
  std::vector<std::thread> threads;
  for (int q = 0; q < num; ++q) {
    threads.emplace_back([&, q] {
      Replicas r = MakeReplicas(per_process, count);
      auto reducer =
          CreateAllReducer(r.devices, {.processes = processes[q].get(), .channel = "stage-0"});
      ASSERT_TRUE(reducer.ok()) << reducer.status();
      EXPECT_EQ((*reducer)->size(), per_process);
      std::vector<ReducePart> parts;
      for (int i = 0; i < per_process; ++i) {
        std::vector<float> init = MixedInput(q * per_process + i, count);
        ASSERT_TRUE(r.devices[i]
                        ->CopyFromHost(r.buffers[i].data(), init.data(), count * sizeof(float))
                        .ok());
        parts.push_back({.data = r.buffers[i].as<float>(), .stream = r.streams[i].get()});
      }
      ASSERT_TRUE((*reducer)->AllReduceAverage(parts, count).ok());
      for (int i = 0; i < per_process; ++i) {
        ASSERT_TRUE(r.streams[i]->Synchronize().ok());
        std::vector<float>& got = out[q * per_process + i];
        got.resize(count);
        ASSERT_TRUE(
            r.devices[i]->CopyToHost(got.data(), r.buffers[i].data(), count * sizeof(float)).ok());
      }
    });
  }
  for (std::thread& t : threads) t.join();
  return out;
}

TEST(HostAllReduceTest, AcrossProcessesHasTheBitsOfOneProcess) {
  constexpr int kCount = 1001;
  // One process holding all 4 participants.
  Replicas one = MakeReplicas(4, kCount);
  PS_ASSERT_OK_AND_ASSIGN(auto reducer, CreateAllReducer(one.devices));
  std::vector<ReducePart> parts;
  for (int i = 0; i < 4; ++i) {
    std::vector<float> init = MixedInput(i, kCount);
    PS_ASSERT_OK(
        one.devices[i]->CopyFromHost(one.buffers[i].data(), init.data(), kCount * sizeof(float)));
    parts.push_back({.data = one.buffers[i].as<float>(), .stream = one.streams[i].get()});
  }
  PS_ASSERT_OK(reducer->AllReduceAverage(parts, kCount));
  for (auto& s : one.streams) PS_ASSERT_OK(s->Synchronize());
  std::vector<float> want(kCount);
  PS_ASSERT_OK(
      one.devices[0]->CopyToHost(want.data(), one.buffers[0].data(), kCount * sizeof(float)));
  // A different order of the same sum differs somewhere: the bits below are a real check.
  std::vector<float> reversed(kCount);
  for (int k = 0; k < kCount; ++k) {
    float sum = MixedInput(3, kCount)[k];
    for (int i = 2; i >= 0; --i) sum += MixedInput(i, kCount)[k];
    reversed[k] = sum * 0.25f;
  }
  ASSERT_NE(reversed, want);

  // 2 processes x 2 participants, and 4 x 1, through both bootstrap kinds.
  for (const auto& [num, per] : {std::pair{2, 2}, std::pair{4, 1}}) {
    PS_ASSERT_OK_AND_ASSIGN(auto in_process, CreateInProcessBootstraps(num));
    for (const std::vector<float>& got : ReduceAcrossProcesses(in_process, per, kCount)) {
      ASSERT_EQ(got, want) << num << " in-process ranks of " << per;
    }
    const std::string dir = (std::filesystem::path(::testing::TempDir()) /
                             absl::StrCat("comm_test_", ::getpid(), "_", num))
                                .string();
    std::filesystem::remove_all(dir);
    std::vector<std::unique_ptr<Bootstrap>> files(num);
    for (int q = 0; q < num; ++q) {
      PS_ASSERT_OK_AND_ASSIGN(files[q], CreateFileBootstrap(dir, q, num));
    }
    for (const std::vector<float>& got : ReduceAcrossProcesses(files, per, kCount)) {
      ASSERT_EQ(got, want) << num << " file ranks of " << per;
    }
    files.clear();  // (their heartbeats stopped before their directory goes)
    std::filesystem::remove_all(dir);
  }
}

TEST(HostAllReduceTest, AcrossProcessesRefusesUnequalParticipantsAndFailsWithoutAPeer) {
  PS_ASSERT_OK_AND_ASSIGN(auto processes, CreateInProcessBootstraps(2, {.timeout_seconds = 0.3}));
  std::vector<absl::Status> created(2);
  std::vector<std::thread> threads;
  for (int q = 0; q < 2; ++q) {
    threads.emplace_back([&, q] {
      Replicas r = MakeReplicas(q + 1, 4);
      created[q] = CreateAllReducer(r.devices, {.processes = processes[q].get()}).status();
    });
  }
  for (std::thread& t : threads) t.join();
  EXPECT_THAT(created[0],
              StatusIs(absl::StatusCode::kFailedPrecondition,
                       HasSubstr("process 1's all-reduce participants differs from process 0's "
                                 "(\"2 host devices\" against \"1 host devices\")")));

  // A process whose peer never comes: its streams fail once the bootstrap gives up, and
  // the local participant still waiting is released with the reason.
  PS_ASSERT_OK_AND_ASSIGN(auto alone, CreateInProcessBootstraps(2, {.timeout_seconds = 0.3}));
  Replicas r = MakeReplicas(2, 4);
  // The agreement check is an exchange too: rank 1 takes part in it, then never reduces.
  std::thread peer([&] {
    Replicas theirs = MakeReplicas(2, 4);
    EXPECT_TRUE(CreateAllReducer(theirs.devices, {.processes = alone[1].get()}).ok());
  });
  PS_ASSERT_OK_AND_ASSIGN(auto reducer, CreateAllReducer(r.devices, {.processes = alone[0].get()}));
  peer.join();
  std::vector<ReducePart> parts;
  for (int i = 0; i < 2; ++i) {
    parts.push_back({.data = r.buffers[i].as<float>(), .stream = r.streams[i].get()});
  }
  PS_ASSERT_OK(reducer->AllReduceAverage(parts, 4));
  std::vector<absl::Status> synced;
  for (auto& s : r.streams) synced.push_back(s->Synchronize());
  const std::string both = synced[0].ToString() + " | " + synced[1].ToString();
  EXPECT_THAT(both, HasSubstr("waited 0.3 s on channel 'all-reduce' (exchange 1) for rank 1"));
  EXPECT_THAT(both, HasSubstr("gives up: participant"));
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
