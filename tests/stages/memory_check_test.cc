// The activation-memory pre-flight (stages/memory_check.h): the message and its
// suggestions on hand-made places, the places of real trainers (the planned peaks are
// what a step then measures, byte for byte), and Trainer::Create refusing a plan that
// cannot fit before any step while the same memory runs a schedule that holds less.
#include "pipesched/stages/memory_check.h"

#include <malloc.h>
#include <unistd.h>

#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "pipesched/base/host_memory.h"
#include "pipesched/model/host_kernels.h"
#include "pipesched/stages/trainer.h"
#include "tests/stages/tiny_trainer.h"
#include "tests/testing/capped_child.h"
#include "tests/testing/status_matchers.h"

namespace pipesched::stages {
namespace {

using ::pipesched::testing::StatusIs;
using ::testing::AllOf;
using ::testing::HasSubstr;
using ::testing::Not;

constexpr std::int64_t kMiB = std::int64_t{1} << 20;

TEST(MemoryCheckTest, FitsWhenEveryPlaceHasRoom) {
  const PlanShape plan{.schedule = "gpipe", .num_ranks = 2, .num_microbatches = 8};
  EXPECT_THAT(CheckActivationsFit(plan, {}), ::pipesched::testing::IsOk());
  EXPECT_THAT(
      CheckActivationsFit(
          plan, {{.name = "host:0", .planned_bytes = 10, .available_bytes = 10, .ranks = 1}}),
      ::pipesched::testing::IsOk());
}

TEST(MemoryCheckTest, GPipeOnTheMachineNamesThePeakAndWhatWouldFit) {
  const PlanShape plan{.schedule = "gpipe", .num_ranks = 2, .num_microbatches = 8};
  const MemoryPlace machine{.name = "host memory",
                            .planned_bytes = 96 * kMiB,
                            .available_bytes = 40 * kMiB,
                            .ranks = 2,
                            .busiest_rank = 1,
                            .busiest_activations = 8,
                            .busiest_bytes = 56 * kMiB,
                            .busiest_microbatch_bytes = 7 * kMiB};
  EXPECT_THAT(
      CheckActivationsFit(plan, {machine}),
      StatusIs(absl::StatusCode::kResourceExhausted,
               "gpipe's activations do not fit in host memory: at its peak the plan holds "
               "96.00 MiB there (2 rank(s); rank 1 alone 56.00 MiB with 8 of M = 8 micro-batches "
               "in flight) but 40.00 MiB is available; use a smaller --microbatch-size, --hidden "
               "or --layers, fewer --microbatches, or a schedule that keeps fewer micro-batches "
               "in flight (1f1b: at most P = 2 on a rank)"));
}

// 1F1B already keeps at most P in flight, fewer than M: neither fewer micro-batches nor
// another schedule would help; on a device, more stages would.
TEST(MemoryCheckTest, OneFOneBOnADeviceSuggestsOnlyWhatHelps) {
  const PlanShape plan{.schedule = "1f1b", .num_ranks = 4, .num_microbatches = 16};
  const std::vector<MemoryPlace> places = {
      {.name = "cuda:0", .planned_bytes = 1, .available_bytes = 2, .ranks = 1},
      {.name = "cuda:1 (NVIDIA H200)",
       .planned_bytes = 3 * kMiB,
       .available_bytes = 2 * kMiB,
       .ranks = 1,
       .busiest_rank = 1,
       .busiest_activations = 3,
       .busiest_bytes = 3 * kMiB,
       .busiest_microbatch_bytes = 1 * kMiB}};
  absl::Status status = CheckActivationsFit(plan, places);
  EXPECT_THAT(status,
              StatusIs(absl::StatusCode::kResourceExhausted,
                       AllOf(HasSubstr("1f1b's activations do not fit in cuda:1 (NVIDIA H200)"),
                             HasSubstr("3 of M = 16 micro-batches in flight"),
                             HasSubstr("use a smaller --microbatch-size, --hidden or --layers, or "
                                       "more --stages (fewer layers on each device)"))));
  EXPECT_THAT(status.message(), Not(HasSubstr("fewer --microbatches")));
  EXPECT_THAT(status.message(), Not(HasSubstr("1f1b: at most")));
}

// A device two ranks share, 2 MiB short, its busiest rank holding 8 chunk activations.
MemoryPlace SharedByTwoRanks() {
  return {.name = "cuda:0",
          .planned_bytes = 12 * kMiB,
          .available_bytes = 10 * kMiB,
          .ranks = 2,
          .busiest_rank = 0,
          .busiest_activations = 8,
          .busiest_bytes = 8 * kMiB,
          .busiest_microbatch_bytes = 2 * kMiB};
}

// V > 1: the count is of chunk activations (up to V x M); a device shared by two ranks
// wants more devices, not more stages.
TEST(MemoryCheckTest, InterleavedOnASharedDeviceCountsChunkActivations) {
  const PlanShape plan{
      .schedule = "interleaved-1f1b", .num_ranks = 2, .num_chunks = 2, .num_microbatches = 4};
  const MemoryPlace shared = SharedByTwoRanks();
  EXPECT_THAT(CheckActivationsFit(plan, {shared}),
              StatusIs(absl::StatusCode::kResourceExhausted,
                       AllOf(HasSubstr("rank 0 alone 8.00 MiB with 8 of V x M = 2 x 4 chunk "
                                       "activations in flight"),
                             HasSubstr("fewer --microbatches"),
                             HasSubstr("(1f1b: at most P = 2 on a rank)"),
                             HasSubstr(", or more devices (--devices)"))));
}

// An embedder's program has no --flags: the fixes are said in its words.
TEST(MemoryCheckTest, FixesAreSaidInTheWordsThePlanGives) {
  PlanShape plan{
      .schedule = "interleaved-1f1b", .num_ranks = 2, .num_chunks = 2, .num_microbatches = 4};
  plan.smaller = "a smaller batch";
  plan.fewer_microbatches = "fewer micro-batches";
  plan.more_devices = "more GPUs";
  const MemoryPlace shared = SharedByTwoRanks();
  const absl::Status status = CheckActivationsFit(plan, {shared});
  EXPECT_THAT(status.message(),
              HasSubstr("use a smaller batch, fewer micro-batches, a schedule that keeps fewer "
                        "micro-batches in flight (1f1b: at most P = 2 on a rank), or more GPUs"));
  EXPECT_THAT(status.message(), Not(HasSubstr("--")));
}

TrainerConfig Config(const std::string& schedule) {
  return stages::testing::TinyTrainerConfig(schedule);
}

// With a capacity every host device is its own place; the plan's peak there is what a
// step then measures on it.
TEST(MemoryCheckTest, PlacesOfDevicesWithACapacityMatchTheMeasuredPeaks) {
  for (const std::string schedule : {"gpipe", "1f1b", "zb-h1"}) {
    TrainerConfig config = Config(schedule);
    config.device_memory_bytes = 64 * kMiB;
    PS_ASSERT_OK_AND_ASSIGN(auto trainer, Trainer::Create(config));
    const Executor& executor = trainer->executor();
    PS_ASSERT_OK_AND_ASSIGN(std::vector<MemoryPlace> places,
                            ActivationPlaces(executor, std::nullopt));
    ASSERT_EQ(places.size(), 2u) << schedule;
    PS_ASSERT_OK_AND_ASSIGN(StepResult step, trainer->Step());
    for (int r = 0; r < 2; ++r) {
      EXPECT_EQ(places[r].name, absl::StrCat("host:", r));
      EXPECT_EQ(places[r].ranks, 1);
      EXPECT_EQ(places[r].busiest_rank, r);
      EXPECT_GT(places[r].planned_bytes, 0);
      EXPECT_EQ(places[r].planned_bytes, step.peak_activation_bytes[r])
          << schedule << " rank " << r;
      EXPECT_EQ(places[r].available_bytes,
                64 * kMiB - executor.device(0, r).memory_stats().current_bytes);
    }
    // Capped host devices still take their memory from the machine: with its
    // availability known, "host memory" holds both ranks' peaks as well.
    PS_ASSERT_OK_AND_ASSIGN(std::vector<MemoryPlace> with_machine,
                            ActivationPlaces(executor, std::int64_t{1} << 40));
    ASSERT_EQ(with_machine.size(), 3u);
    EXPECT_EQ(with_machine[1].name, "host memory");
    EXPECT_EQ(with_machine[1].ranks, 2);
    EXPECT_EQ(with_machine[1].planned_bytes, places[0].planned_bytes + places[1].planned_bytes);
    // GPipe holds all M on every rank; 1F1B P - r on rank r.
    if (schedule == "gpipe") {
      EXPECT_EQ(places[0].busiest_activations, 8);
    }
    if (schedule == "1f1b") {
      EXPECT_EQ(places[0].busiest_activations, 2);
      EXPECT_EQ(places[1].busiest_activations, 1);
    }
  }
}

// Without a capacity the host devices share the machine: one place, the ranks' peaks
// added, against the availability given; unknown availability checks nothing.
TEST(MemoryCheckTest, HostDevicesWithoutACapacityShareTheMachine) {
  TrainerConfig config = Config("gpipe");
  config.replicas = 2;
  PS_ASSERT_OK_AND_ASSIGN(auto trainer, Trainer::Create(config));
  PS_ASSERT_OK_AND_ASSIGN(std::vector<MemoryPlace> places,
                          ActivationPlaces(trainer->executor(), 12345));
  ASSERT_EQ(places.size(), 1u);
  EXPECT_EQ(places[0].name, "host memory");
  EXPECT_EQ(places[0].ranks, 4);
  EXPECT_EQ(places[0].available_bytes, 12345);
  PS_ASSERT_OK_AND_ASSIGN(StepResult step, trainer->Step());
  std::int64_t measured = 0;
  for (std::int64_t peak : step.peak_activation_bytes) measured += peak;
  EXPECT_EQ(places[0].planned_bytes, measured);
  PS_ASSERT_OK_AND_ASSIGN(places, ActivationPlaces(trainer->executor(), std::nullopt));
  EXPECT_TRUE(places.empty());
}

// The same per-device memory: GPipe (all 8 micro-batches on rank 0) is refused at
// Create, before any step; 1F1B (2 on rank 0) runs.
TEST(MemoryCheckTest, TrainerRefusesAPlanThatCannotFitBeforeTheFirstStep) {
  std::int64_t state = 0, one_f_one_b = 0;
  {
    PS_ASSERT_OK_AND_ASSIGN(auto probe, Trainer::Create(Config("1f1b")));
    state = probe->executor().device(0, 0).memory_stats().current_bytes;
    PS_ASSERT_OK_AND_ASSIGN(std::vector<MemoryPlace> places,
                            ActivationPlaces(probe->executor(), std::int64_t{1} << 40));
    one_f_one_b = places[0].busiest_bytes;  // rank 0's peak: the larger one
  }
  TrainerConfig config = Config("gpipe");
  config.device_memory_bytes = state + one_f_one_b;
  EXPECT_THAT(Trainer::Create(config),
              StatusIs(absl::StatusCode::kResourceExhausted,
                       AllOf(HasSubstr("gpipe's activations do not fit in host:0"),
                             HasSubstr("with 8 of M = 8 micro-batches in flight"),
                             HasSubstr("1f1b: at most P = 2 on a rank"))));
  config.schedule = "1f1b";
  PS_ASSERT_OK_AND_ASSIGN(auto trainer, Trainer::Create(config));
  PS_ASSERT_OK_AND_ASSIGN(StepResult step, trainer->Step());
  EXPECT_TRUE(std::isfinite(step.loss));
  EXPECT_EQ(step.peak_activation_bytes[0], one_f_one_b);
  config.device_memory_bytes = -1;
  EXPECT_THAT(Trainer::Create(config),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("device memory cap")));
}

// The host backend's stages multiply through OpenBLAS, whose work buffers (128 MiB of
// address space each) the trainer maps when it is made: under a limit with no room for
// them it is refused there, naming the limit, where a step used to hang.
TEST(MemoryCheckTest, TrainerRefusesWhenOpenBlasCannotMapItsWorkBuffers) {
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
  GTEST_SKIP() << "the sanitizers' runtimes need more address space than the cap leaves";
#else
  // Before the fork: in the child (whose OpenBLAS threads the fork stopped) the first
  // call would start them again, with no room for their stacks.
  model::host::SetBlasSingleThreaded();
  TrainerConfig config = testing::TinyTrainerConfig("1f1b");
  // More compute streams than buffers made sure of so far, so that one must be mapped.
  config.replicas = model::host::ReservedBlasWorkspaces() / 2 + 1;
  const int streams = 2 * config.replicas;
  // Room for the threads (four streams per rank and one setting up a chunk, a stack each)
  // and some to spare, not for a 128 MiB buffer.
  const std::size_t headroom = static_cast<std::size_t>(4 * streams + 1) *
                                   static_cast<std::size_t>(DefaultThreadStackBytes()) +
                               (96 << 20);
  const std::optional<int> code = pipesched::testing::RunWithCappedAddressSpace(headroom, [&] {
    ::alarm(120);  // a hang ends the child with SIGALRM: the test fails, not the run
    // No per-thread malloc arenas (64 MiB of address space each): the room stays for the
    // stacks, whichever thread allocates first.
    ::mallopt(M_ARENA_MAX, 1);
    absl::StatusOr<std::unique_ptr<Trainer> > trainer = Trainer::Create(config);
    if (trainer.ok()) return 20;
    const std::string message(trainer.status().message());
    if (!absl::IsResourceExhausted(trainer.status())) {
      std::fprintf(stderr, "%s\n", message.c_str());
      return 21;
    }
    const bool right =
        message.rfind("OpenBLAS maps a ", 0) == 0 &&
        message.find("this process's address-space limit (ulimit -v) leaves ") !=
            std::string::npos &&
        message.find(absl::StrCat("; use fewer threads multiplying at once, or raise that "
                                  "limit (the pipeline multiplies on its ",
                                  streams, " compute streams at once: --stages x --replicas)")) !=
            std::string::npos;
    if (!right) std::fprintf(stderr, "%s\n", message.c_str());
    return right ? 0 : 22;
  });
  ASSERT_TRUE(code.has_value()) << "the child hung (SIGALRM) or crashed";
  EXPECT_EQ(*code, 0) << "3/4: setup failed, 20: made, 21: another error, 22: another message";
#endif
}

}  // namespace
}  // namespace pipesched::stages
