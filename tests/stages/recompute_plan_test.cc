// PlanRecompute (stages/recompute_plan.h): the stages a trainer recomputes so that each
// rank's activations fit what its own device has left, from the bytes this executor
// really holds; the trainer built with them then measures the planned peaks.
#include "pipesched/stages/recompute_plan.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "pipesched/stages/memory_check.h"
#include "pipesched/stages/trainer.h"
#include "tests/stages/tiny_trainer.h"
#include "tests/testing/status_matchers.h"

namespace pipesched::stages {
namespace {

using ::pipesched::testing::StatusIs;
using ::testing::AllOf;
using ::testing::HasSubstr;
using ::testing::Not;

constexpr std::int64_t kMiB = std::int64_t{1} << 20;

// The memory tests' tiny trainer on devices of 64 MiB.
TrainerConfig Config(const std::string& schedule) {
  TrainerConfig config = stages::testing::TinyTrainerConfig(schedule);
  config.device_memory_bytes = 64 * kMiB;
  return config;
}

// Per rank of `config`'s trainer: what its device holds once built (parameters,
// gradients, optimizer state) and its planned activation peak.
struct Probe {
  std::vector<std::int64_t> state, peak;
};

Probe Measure(const TrainerConfig& config) {
  Probe probe;
  absl::StatusOr<std::unique_ptr<Trainer>> trainer = Trainer::Create(config);
  EXPECT_TRUE(trainer.ok()) << trainer.status();
  if (!trainer.ok()) return probe;
  absl::StatusOr<std::vector<MemoryPlace>> places =
      ActivationPlaces((*trainer)->executor(), std::nullopt);
  EXPECT_TRUE(places.ok()) << places.status();
  if (!places.ok()) return probe;
  for (int r = 0; r < config.stages; ++r) {
    probe.state.push_back((*trainer)->executor().device(0, r).memory_stats().current_bytes);
    probe.peak.push_back((*places)[r].planned_bytes);
  }
  return probe;
}

// The same with every stage recomputing.
Probe MeasureRecomputing(TrainerConfig config) {
  config.recompute = true;
  return Measure(config);
}

const RecomputePlan::Place* Find(const RecomputePlan& plan, const std::string& name) {
  for (const RecomputePlan::Place& place : plan.places) {
    if (place.name == name) return &place;
  }
  return nullptr;
}

// GPipe holds all 8 micro-batches on each rank. A device size that rank 0 fits as it is
// and rank 1 (the head's larger parameters) fits only recomputing: stage 1 alone
// recomputes, each device is held to what it has left after its own rank's state, and
// the trainer built with the choice measures the planned peaks.
TEST(RecomputePlanTest, RecomputesOnlyTheRankThatDoesNotFit) {
  const Probe plain = Measure(Config("gpipe"));
  const Probe all = MeasureRecomputing(Config("gpipe"));
  ASSERT_EQ(plain.peak.size(), 2u);
  ASSERT_EQ(all.peak.size(), 2u);
  EXPECT_EQ(all.state, plain.state);
  EXPECT_LT(all.peak[1], plain.peak[1]);
  const std::int64_t size = std::max(plain.state[0] + plain.peak[0], plain.state[1] + all.peak[1]);
  ASSERT_LT(size, plain.state[1] + plain.peak[1]) << "the test's model no longer splits so";

  for (int replicas : {1, 2}) {
    TrainerConfig config = Config("gpipe");
    config.device_memory_bytes = size;
    config.replicas = replicas;
    PS_ASSERT_OK_AND_ASSIGN(const RecomputePlan plan, PlanRecompute(config));
    EXPECT_EQ(plan.stages, (std::vector<int>{1})) << replicas;
    EXPECT_EQ(plan.num_stages, 2);
    EXPECT_EQ(plan.peak_without, plain.peak);
    EXPECT_EQ(plan.peak_with, (std::vector<std::int64_t>{plain.peak[0], all.peak[1]}));
    // Each device, and the machine's memory that they all take from.
    ASSERT_EQ(plan.places.size(), static_cast<std::size_t>(2 * replicas + 1));
    for (int device = 0; device < 2 * replicas; ++device) {
      const RecomputePlan::Place* place = Find(plan, absl::StrCat("host:", device));
      ASSERT_NE(place, nullptr) << device;
      const int rank = device % 2;
      EXPECT_EQ(place->available_bytes, size - plain.state[rank]);
      EXPECT_EQ(place->planned_without, plain.peak[rank]);
      EXPECT_EQ(place->planned_with, plan.peak_with[rank]);
    }
    const RecomputePlan::Place* machine = Find(plan, "host memory");
    ASSERT_NE(machine, nullptr);
    EXPECT_EQ(machine->planned_with, replicas * (plain.peak[0] + all.peak[1]));

    // Without the choice the trainer refuses the size; with it, it runs in it.
    EXPECT_THAT(Trainer::Create(config), StatusIs(absl::StatusCode::kResourceExhausted,
                                                  HasSubstr("gpipe's activations do not fit")));
    config.recompute_stages = plan.stages;
    PS_ASSERT_OK_AND_ASSIGN(auto trainer, Trainer::Create(config));
    PS_ASSERT_OK_AND_ASSIGN(StepResult step, trainer->Step());
    EXPECT_TRUE(std::isfinite(step.loss));
    ASSERT_EQ(step.peak_activation_bytes.size(), static_cast<std::size_t>(2 * replicas));
    for (int i = 0; i < 2 * replicas; ++i) {
      EXPECT_EQ(step.peak_activation_bytes[i], plan.peak_with[i % 2]) << "device " << i;
    }
  }
}

// Both ranks on one device (as on a single GPU): their peaks add up there, so the choice
// is for the sum. Room for one recomputing rank's savings: one stage, the one that lowers
// the sum more; room only for both recomputing: both.
TEST(RecomputePlanTest, RanksSharingADeviceAreHeldToItTogether) {
  TrainerConfig config = Config("gpipe");
  config.num_devices = 1;
  const Probe plain = Measure(Config("gpipe"));
  const Probe all = MeasureRecomputing(Config("gpipe"));
  ASSERT_EQ(plain.peak.size(), 2u);
  ASSERT_EQ(all.peak.size(), 2u);
  std::int64_t state = 0;
  {
    PS_ASSERT_OK_AND_ASSIGN(auto shared, Trainer::Create(config));
    state = shared->executor().device(0, 0).memory_stats().current_bytes;
  }
  const std::int64_t one = std::min(all.peak[0] + plain.peak[1], plain.peak[0] + all.peak[1]);
  const int cheaper = all.peak[0] + plain.peak[1] <= plain.peak[0] + all.peak[1] ? 0 : 1;
  config.device_memory_bytes = state + one;
  PS_ASSERT_OK_AND_ASSIGN(RecomputePlan plan, PlanRecompute(config));
  EXPECT_EQ(plan.stages, (std::vector<int>{cheaper}));
  const RecomputePlan::Place* device = Find(plan, "host:0");
  ASSERT_NE(device, nullptr);
  EXPECT_EQ(device->available_bytes, one);
  EXPECT_EQ(device->planned_with, one);
  EXPECT_EQ(device->planned_without, plain.peak[0] + plain.peak[1]);
  config.device_memory_bytes = state + all.peak[0] + all.peak[1];
  PS_ASSERT_OK_AND_ASSIGN(plan, PlanRecompute(config));
  EXPECT_EQ(plan.stages, (std::vector<int>{0, 1}));
  config.recompute_stages = plan.stages;
  PS_ASSERT_OK_AND_ASSIGN(auto trainer, Trainer::Create(config));
  PS_ASSERT_OK_AND_ASSIGN(StepResult step, trainer->Step());
  EXPECT_TRUE(std::isfinite(step.loss));
}

// Without a device size the host devices take from the machine's memory, which holds
// this tiny model's activations as they are.
TEST(RecomputePlanTest, NothingRecomputesWhenEverythingFits) {
  TrainerConfig config = Config("1f1b");
  config.device_memory_bytes = 0;
  PS_ASSERT_OK_AND_ASSIGN(const RecomputePlan plan, PlanRecompute(config));
  EXPECT_TRUE(plan.stages.empty());
  EXPECT_EQ(plan.peak_with, plan.peak_without);
  ASSERT_EQ(plan.places.size(), 1u);
  EXPECT_EQ(plan.places[0].name, "host memory");
  EXPECT_EQ(plan.places[0].planned_with, plan.peak_with[0] + plan.peak_with[1]);
}

TEST(RecomputePlanTest, SaysWhatKeepsItFromChoosing) {
  const Probe all = MeasureRecomputing(Config("gpipe"));
  ASSERT_EQ(all.peak.size(), 2u);
  TrainerConfig config = Config("gpipe");
  config.device_memory_bytes = all.state[1] + all.peak[1] - 1;
  EXPECT_THAT(PlanRecompute(config),
              StatusIs(absl::StatusCode::kResourceExhausted,
                       HasSubstr("even with every stage recomputing its activations: gpipe's "
                                 "activations do not fit in host:1")));
  // What is there before any activation does not fit: said as it is, not as an
  // activation problem. The last buffer of rank 1's state is the step's losses; half of
  // its state does not hold the parameters, gradients and moments.
  config.device_memory_bytes = all.state[1] - 1;
  EXPECT_THAT(PlanRecompute(config),
              StatusIs(absl::StatusCode::kResourceExhausted,
                       AllOf(HasSubstr("the step's losses (8 micro-batches of 4 bytes) do not "
                                       "fit: host:1: cannot allocate 32 bytes: 31 bytes free"),
                             HasSubstr("; give a larger --device-memory (now "),
                             ::testing::EndsWith("), or fewer micro-batches"),
                             Not(HasSubstr("recomputing")))));
  config.device_memory_bytes = all.state[1] / 2;
  EXPECT_THAT(PlanRecompute(config),
              StatusIs(absl::StatusCode::kResourceExhausted,
                       AllOf(HasSubstr("the model does not fit the device memory cap"),
                             Not(HasSubstr("recomputing")))));
  config = Config("gpipe");
  config.recompute_stages = {0};
  EXPECT_THAT(PlanRecompute(config),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("recomputes none yet")));
  config = Config("gpipe");
  config.stages = 0;
  EXPECT_FALSE(PlanRecompute(config).ok());  // what Trainer::Create refuses
}

}  // namespace
}  // namespace pipesched::stages
