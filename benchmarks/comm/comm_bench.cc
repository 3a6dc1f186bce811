// One AllGather between two ranks of a comm::Bootstrap (the benchmark's thread is rank 0,
// a helper thread rank 1, each giving `bytes` bytes), per kind; and, as BM_*RoundTrip,
// one message of `bytes` from rank 0 to rank 1 and back (Send / Receive), the way a
// pipeline stage's activation would cross to another process:
//   BM_InProcessAllGather/bytes: the in-process kind (a mutex and a condition variable);
//   BM_FileAllGather/bytes:      the file kind in a fresh directory under /tmp: a write,
//                                a link and a read per rank, and the polling between.
//   BM_MpiAllGather/bytes:       the MPI kind, between the processes of `mpiexec -n 2
//                                comm_bench --benchmark_filter=Mpi` (each runs the same
//                                fixed number of iterations; process 0's figures are the
//                                ones to read); skipped when not started by an MPI launcher.
// BM_*GroupAllGather: the same AllGather through a group of both ranks
// (CreateGroupBootstrap), which is a Send to the other rank and a Receive from it: what a
// two-dimensional job's pipeline and replica groups pay per exchange.
// The host backend's all-reduce across processes sends each gradient buffer of a stage
// through one such exchange (docs/benchmarks.md, "Processes"), so /bytes is its size.
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "benchmark/benchmark.h"
#include "pipesched/comm/bootstrap.h"

namespace pipesched::comm {
namespace {

// Rank 1 answers every exchange until rank 0 sends "stop".
void Answer(Bootstrap& rank1, const std::string& payload) {
  for (;;) {
    absl::StatusOr<std::vector<std::string>> all = rank1.AllGather("bench", payload);
    if (!all.ok() || (*all)[0] == "stop") return;
  }
}

// Rank 1 sends back every message of rank 0's until "stop" (or an error).
void Echo(Bootstrap& rank1) {
  for (;;) {
    absl::StatusOr<std::string> got = rank1.Receive(0, "bench");
    if (!got.ok() || *got == "stop" || !rank1.Send(0, "bench", *got).ok()) return;
  }
}

// One iteration: rank 0's AllGather (kAllGather) or its message there and back
// (kRoundTrip), against rank 1 on a thread of its own.
enum class Pattern { kAllGather, kRoundTrip, kGroupAllGather };

void Run(benchmark::State& state, std::vector<std::unique_ptr<Bootstrap>>& job, Pattern pattern) {
  std::vector<std::unique_ptr<Bootstrap>> groups;
  if (pattern == Pattern::kGroupAllGather) {
    for (int r = 0; r < 2; ++r) {
      absl::StatusOr<std::unique_ptr<Bootstrap>> group = CreateGroupBootstrap(*job[r], {0, 1}, "g");
      if (!group.ok()) {
        state.SkipWithError(std::string(group.status().message()).c_str());
        return;
      }
      groups.push_back(*std::move(group));
    }
    pattern = Pattern::kAllGather;
  }
  std::vector<std::unique_ptr<Bootstrap>>& ranks = groups.empty() ? job : groups;
  const std::string payload(static_cast<std::size_t>(state.range(0)), 'g');
  std::thread helper([&] {
    if (pattern == Pattern::kAllGather) {
      Answer(*ranks[1], payload);
    } else {
      Echo(*ranks[1]);
    }
  });
  for (auto _ : state) {
    absl::Status status;
    if (pattern == Pattern::kAllGather) {
      absl::StatusOr<std::vector<std::string>> all = ranks[0]->AllGather("bench", payload);
      status = all.status();
      if (all.ok()) benchmark::DoNotOptimize(all->data());
    } else {
      status = ranks[0]->Send(1, "bench", payload);
      absl::StatusOr<std::string> back =
          status.ok() ? ranks[0]->Receive(1, "bench") : absl::StatusOr<std::string>(status);
      status = back.status();
      if (back.ok()) benchmark::DoNotOptimize(back->data());
    }
    if (!status.ok()) {
      state.SkipWithError(std::string(status.message()).c_str());
      break;
    }
  }
  if (pattern == Pattern::kAllGather) {
    (void)ranks[0]->AllGather("bench", "stop");
  } else {
    (void)ranks[0]->Send(1, "bench", "stop");
  }
  helper.join();
  state.SetBytesProcessed(state.iterations() * state.range(0) * 2);
}

void InProcess(benchmark::State& state, Pattern pattern) {
  absl::StatusOr<std::vector<std::unique_ptr<Bootstrap>>> ranks = CreateInProcessBootstraps(2);
  if (!ranks.ok()) {
    state.SkipWithError(std::string(ranks.status().message()).c_str());
    return;
  }
  Run(state, *ranks, pattern);
}

void File(benchmark::State& state, Pattern pattern) {
  static int run = 0;
  const std::string dir =
      (std::filesystem::temp_directory_path() / absl::StrCat("comm_bench_", ::getpid(), "_", run++))
          .string();
  std::vector<std::unique_ptr<Bootstrap>> ranks(2);
  for (int r = 0; r < 2; ++r) {
    // The second argument: whether waits are woken by the directory's events.
    absl::StatusOr<std::unique_ptr<Bootstrap>> b =
        CreateFileBootstrap(dir, r, 2, {.watch_directory = state.range(1) != 0});
    if (!b.ok()) {
      state.SkipWithError(std::string(b.status().message()).c_str());
      std::filesystem::remove_all(dir);
      return;
    }
    ranks[r] = *std::move(b);
  }
  Run(state, ranks, pattern);
  std::thread closing([&] { (void)ranks[1]->Close(); });
  (void)ranks[0]->Close();
  closing.join();
  std::filesystem::remove_all(dir);
}

// Between the processes of `mpiexec -n 2`, each running the same fixed number of
// iterations: rank 0 as Run's, rank 1 as its helper's.
void Mpi(benchmark::State& state, Pattern pattern) {
  if (std::getenv("OMPI_COMM_WORLD_SIZE") == nullptr && std::getenv("PMI_SIZE") == nullptr) {
    state.SkipWithError("not started by an MPI launcher: run `mpiexec -n 2 comm_bench`");
    return;
  }
  absl::StatusOr<std::unique_ptr<Bootstrap>> bootstrap = CreateMpiBootstrap();
  if (!bootstrap.ok()) {
    state.SkipWithError(std::string(bootstrap.status().message()).c_str());
    return;
  }
  std::unique_ptr<Bootstrap> group;
  if (pattern == Pattern::kGroupAllGather) {
    absl::StatusOr<std::unique_ptr<Bootstrap>> made =
        CreateGroupBootstrap(**bootstrap, {0, 1}, "g");
    if (!made.ok()) {
      state.SkipWithError(std::string(made.status().message()).c_str());
      return;
    }
    group = *std::move(made);
    pattern = Pattern::kAllGather;
  }
  Bootstrap& b = group != nullptr ? *group : **bootstrap;
  const std::string payload(static_cast<std::size_t>(state.range(0)), 'g');
  const int peer = b.rank() == 0 ? 1 : 0;
  for (auto _ : state) {
    absl::Status status;
    if (pattern == Pattern::kAllGather) {
      absl::StatusOr<std::vector<std::string>> all = b.AllGather("bench", payload);
      status = all.status();
    } else if (b.rank() == 0) {
      status = b.Send(peer, "bench", payload);
      if (status.ok()) status = b.Receive(peer, "bench").status();
    } else if (b.rank() == 1) {
      absl::StatusOr<std::string> got = b.Receive(peer, "bench");
      status = got.ok() ? b.Send(peer, "bench", *got) : got.status();
    }
    if (!status.ok()) {
      state.SkipWithError(std::string(status.message()).c_str());
      break;
    }
  }
  state.SetBytesProcessed(state.iterations() * state.range(0) * 2);
  (void)(*bootstrap)->Close();
}

void BM_InProcessAllGather(benchmark::State& state) { InProcess(state, Pattern::kAllGather); }
void BM_InProcessRoundTrip(benchmark::State& state) { InProcess(state, Pattern::kRoundTrip); }
void BM_FileAllGather(benchmark::State& state) { File(state, Pattern::kAllGather); }
void BM_FileRoundTrip(benchmark::State& state) { File(state, Pattern::kRoundTrip); }
void BM_MpiAllGather(benchmark::State& state) { Mpi(state, Pattern::kAllGather); }
void BM_MpiRoundTrip(benchmark::State& state) { Mpi(state, Pattern::kRoundTrip); }
void BM_InProcessGroupAllGather(benchmark::State& state) {
  InProcess(state, Pattern::kGroupAllGather);
}
void BM_FileGroupAllGather(benchmark::State& state) { File(state, Pattern::kGroupAllGather); }
void BM_MpiGroupAllGather(benchmark::State& state) { Mpi(state, Pattern::kGroupAllGather); }
BENCHMARK(BM_InProcessAllGather)->Arg(8)->Arg(1 << 20)->UseRealTime();
BENCHMARK(BM_InProcessRoundTrip)->Arg(8)->Arg(1 << 20)->UseRealTime();
BENCHMARK(BM_FileAllGather)->ArgsProduct({{8, 1 << 20}, {1, 0}})->UseRealTime();
BENCHMARK(BM_FileRoundTrip)->ArgsProduct({{8, 1 << 20}, {1, 0}})->UseRealTime();
BENCHMARK(BM_InProcessGroupAllGather)->Arg(8)->Arg(1 << 20)->UseRealTime();
BENCHMARK(BM_FileGroupAllGather)->ArgsProduct({{8, 1 << 20}, {1, 0}})->UseRealTime();
// Fixed iterations: every process must make the same exchanges.
BENCHMARK(BM_MpiAllGather)->Arg(8)->Iterations(20000)->UseRealTime();
BENCHMARK(BM_MpiAllGather)->Arg(1 << 20)->Iterations(500)->UseRealTime();
BENCHMARK(BM_MpiRoundTrip)->Arg(8)->Iterations(20000)->UseRealTime();
BENCHMARK(BM_MpiRoundTrip)->Arg(1 << 20)->Iterations(500)->UseRealTime();
BENCHMARK(BM_MpiGroupAllGather)->Arg(8)->Iterations(20000)->UseRealTime();
BENCHMARK(BM_MpiGroupAllGather)->Arg(1 << 20)->Iterations(500)->UseRealTime();

}  // namespace
}  // namespace pipesched::comm
