// One AllGather between two ranks of a comm::Bootstrap (the benchmark's thread is rank 0,
// a helper thread rank 1, each giving `bytes` bytes), per kind:
//   BM_InProcessAllGather/bytes: the in-process kind (a mutex and a condition variable);
//   BM_FileAllGather/bytes:      the file kind in a fresh directory under /tmp: a write,
//                                a link and a read per rank, and the polling between.
//   BM_MpiAllGather/bytes:       the MPI kind, between the processes of `mpiexec -n 2
//                                comm_bench --benchmark_filter=Mpi` (each runs the same
//                                fixed number of iterations; process 0's figures are the
//                                ones to read); skipped when not started by an MPI launcher.
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

void Run(benchmark::State& state, std::vector<std::unique_ptr<Bootstrap>>& ranks) {
  const std::string payload(static_cast<std::size_t>(state.range(0)), 'g');
  std::thread helper([&] { Answer(*ranks[1], payload); });
  for (auto _ : state) {
    absl::StatusOr<std::vector<std::string>> all = ranks[0]->AllGather("bench", payload);
    if (!all.ok()) {
      state.SkipWithError(std::string(all.status().message()).c_str());
      break;
    }
    benchmark::DoNotOptimize(all->data());
  }
  (void)ranks[0]->AllGather("bench", "stop");
  helper.join();
  state.SetBytesProcessed(state.iterations() * state.range(0) * 2);
}

void BM_InProcessAllGather(benchmark::State& state) {
  absl::StatusOr<std::vector<std::unique_ptr<Bootstrap>>> ranks = CreateInProcessBootstraps(2);
  if (!ranks.ok()) {
    state.SkipWithError(std::string(ranks.status().message()).c_str());
    return;
  }
  Run(state, *ranks);
}
BENCHMARK(BM_InProcessAllGather)->Arg(8)->Arg(1 << 20)->UseRealTime();

void BM_FileAllGather(benchmark::State& state) {
  static int run = 0;
  const std::string dir =
      (std::filesystem::temp_directory_path() / absl::StrCat("comm_bench_", ::getpid(), "_", run++))
          .string();
  std::vector<std::unique_ptr<Bootstrap>> ranks(2);
  for (int r = 0; r < 2; ++r) {
    absl::StatusOr<std::unique_ptr<Bootstrap>> b = CreateFileBootstrap(dir, r, 2);
    if (!b.ok()) {
      state.SkipWithError(std::string(b.status().message()).c_str());
      std::filesystem::remove_all(dir);
      return;
    }
    ranks[r] = *std::move(b);
  }
  Run(state, ranks);
  std::thread closing([&] { (void)ranks[1]->Close(); });
  (void)ranks[0]->Close();
  closing.join();
  std::filesystem::remove_all(dir);
}
BENCHMARK(BM_FileAllGather)->Arg(8)->Arg(1 << 20)->UseRealTime();

void BM_MpiAllGather(benchmark::State& state) {
  if (std::getenv("OMPI_COMM_WORLD_SIZE") == nullptr && std::getenv("PMI_SIZE") == nullptr) {
    state.SkipWithError("not started by an MPI launcher: run `mpiexec -n 2 comm_bench`");
    return;
  }
  absl::StatusOr<std::unique_ptr<Bootstrap>> bootstrap = CreateMpiBootstrap();
  if (!bootstrap.ok()) {
    state.SkipWithError(std::string(bootstrap.status().message()).c_str());
    return;
  }
  Bootstrap& b = **bootstrap;
  const std::string payload(static_cast<std::size_t>(state.range(0)), 'g');
  for (auto _ : state) {
    absl::StatusOr<std::vector<std::string>> all = b.AllGather("bench", payload);
    if (!all.ok()) {
      state.SkipWithError(std::string(all.status().message()).c_str());
      break;
    }
    benchmark::DoNotOptimize(all->data());
  }
  state.SetBytesProcessed(state.iterations() * state.range(0) * b.size());
  (void)b.Close();
}
// Fixed iterations: every process must make the same exchanges.
BENCHMARK(BM_MpiAllGather)->Arg(8)->Iterations(20000)->UseRealTime();
BENCHMARK(BM_MpiAllGather)->Arg(1 << 20)->Iterations(500)->UseRealTime();

}  // namespace
}  // namespace pipesched::comm
