// Every generator over a grid of shapes: each call either refuses with an
// InvalidArgument sentence or returns a complete, correctly placed schedule that runs to
// the end when every rank executes its program in order. The in-order walk lives here,
// independent of scheduler/validate.cc, so the two check each other; Validate() must
// agree on every generated schedule. With uniform costs the walk's makespan also pins
// the closed forms the generators are documented with.
#include <algorithm>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "pipesched/base/strings.h"
#include "pipesched/scheduler/registry.h"
#include "pipesched/scheduler/schedule.h"
#include "pipesched/scheduler/validate.h"

namespace pipesched::scheduler {
namespace {

struct Costs {
  double f = 1, b = 2, i = 1, w = 1;
};

struct WalkResult {
  bool finished = false;
  std::string stuck;  // each blocked rank's next action, when not finished
  double makespan = 0;
};

// Runs every rank's program in order; an action starts when its rank is free and its
// dependencies (DESIGN.md: F(s,m) after F(s-1,m); B/I(s,m) after F(s,m) and B/I(s+1,m);
// W(s,m) after I(s,m)) have finished. Finished means no rank is left blocked.
WalkResult Walk(const Schedule& schedule, const Costs& costs = {}) {
  const int num_stages = schedule.num_stages();
  const int m = schedule.num_microbatches;
  auto index = [&](int stage, int mb) { return stage * m + mb; };
  constexpr double kNotDone = -1;
  std::vector<double> f_end(num_stages * m, kNotDone), bi_end(num_stages * m, kNotDone),
      i_end(num_stages * m, kNotDone);
  std::vector<std::size_t> pc(schedule.programs.size(), 0);
  std::vector<double> rank_free(schedule.programs.size(), 0);
  WalkResult result;
  for (bool progress = true; progress;) {
    progress = false;
    for (std::size_t r = 0; r < schedule.programs.size(); ++r) {
      const auto& program = schedule.programs[r];
      while (pc[r] < program.size()) {
        const Action& a = program[pc[r]];
        double ready = rank_free[r];
        bool ok = true;
        auto need = [&](double end) {
          if (end == kNotDone) ok = false;
          ready = std::max(ready, end);
        };
        double cost = 0;
        switch (a.op) {
          case Op::kF:
            if (a.stage > 0) need(f_end[index(a.stage - 1, a.microbatch)]);
            cost = costs.f;
            break;
          case Op::kB:
          case Op::kI:
            need(f_end[index(a.stage, a.microbatch)]);
            if (a.stage + 1 < num_stages) need(bi_end[index(a.stage + 1, a.microbatch)]);
            cost = a.op == Op::kB ? costs.b : costs.i;
            break;
          case Op::kW:
            need(i_end[index(a.stage, a.microbatch)]);
            cost = costs.w;
            break;
          default:
            break;
        }
        if (!ok) break;
        const double end = ready + cost;
        rank_free[r] = end;
        result.makespan = std::max(result.makespan, end);
        if (a.op == Op::kF) f_end[index(a.stage, a.microbatch)] = end;
        if (a.op == Op::kB || a.op == Op::kI) bi_end[index(a.stage, a.microbatch)] = end;
        if (a.op == Op::kI) i_end[index(a.stage, a.microbatch)] = end;
        ++pc[r];
        progress = true;
      }
    }
  }
  result.finished = true;
  for (std::size_t r = 0; r < schedule.programs.size(); ++r) {
    if (pc[r] < schedule.programs[r].size()) {
      result.finished = false;
      absl::StrAppend(&result.stuck, " rank ", r, " at ", ToString(schedule.programs[r][pc[r]]));
    }
  }
  return result;
}

// Empty when the schedule has the right shape: P programs, every action on the rank
// its stage is placed on, and every (stage, mb) with F once and B once or I and W once.
std::string CheckComplete(const Schedule& schedule, int p, int m) {
  if (schedule.num_ranks() != p || schedule.num_microbatches != m ||
      static_cast<int>(schedule.programs.size()) != p) {
    return "wrong shape";
  }
  const int num_stages = schedule.num_stages();
  std::vector<std::vector<int>> count(num_stages * m, std::vector<int>(4, 0));
  for (int r = 0; r < p; ++r) {
    for (const Action& a : schedule.programs[r]) {
      if (a.stage < 0 || a.stage >= num_stages || a.microbatch < 0 || a.microbatch >= m ||
          !IsCompute(a.op)) {
        return absl::StrCat("out of range or not compute: ", ToString(a));
      }
      if (schedule.placement.RankOf(a.stage) != r) {
        return absl::StrCat(ToString(a), " on rank ", r, " but its stage is on rank ",
                            schedule.placement.RankOf(a.stage));
      }
      ++count[a.stage * m + a.microbatch][static_cast<int>(a.op)];
    }
  }
  for (int s = 0; s < num_stages; ++s) {
    for (int mb = 0; mb < m; ++mb) {
      const auto& c = count[s * m + mb];  // F, B, I, W
      const bool full = c[0] == 1 && c[1] == 1 && c[2] == 0 && c[3] == 0;
      const bool split = c[0] == 1 && c[1] == 0 && c[2] == 1 && c[3] == 1;
      if (!full && !split) {
        return absl::StrCat("stage ", s, " mb ", mb, " has F x", c[0], " B x", c[1], " I x", c[2],
                            " W x", c[3]);
      }
    }
  }
  return "";
}

TEST(GeneratorSweepTest, EveryShapeIsRefusedOrCompleteAndDeadlockFree) {
  int generated = 0;
  int refused = 0;
  for (const ScheduleInfo& info : AllSchedules()) {
    for (int p = 1; p <= 8; ++p) {
      for (int v : {0, 1, 2, 4}) {
        for (int m = 1; m <= 32; ++m) {
          const std::string where = absl::StrCat(Absl(info.name), " P=", p, " V=", v, " M=", m);
          absl::StatusOr<Schedule> schedule = info.generate({p, m, v});
          if (!schedule.ok()) {
            EXPECT_EQ(schedule.status().code(), absl::StatusCode::kInvalidArgument) << where;
            EXPECT_FALSE(schedule.status().message().empty()) << where;
            ++refused;
            continue;
          }
          ++generated;
          EXPECT_EQ(schedule->num_chunks(), v == 0 ? info.default_chunks : v) << where;
          const std::string problem = CheckComplete(*schedule, p, m);
          EXPECT_EQ(problem, "") << where;
          if (!problem.empty()) continue;
          const WalkResult walk = Walk(*schedule);
          EXPECT_TRUE(walk.finished) << where << ": blocked:" << walk.stuck;
          const absl::Status valid = Validate(*schedule);
          EXPECT_TRUE(valid.ok()) << where << ": " << valid;
        }
      }
    }
  }
  // Every generator accepts its default V for every P and M but interleaved-1f1b's
  // uneven rounds; make sure the sweep did not pass by refusing everything.
  EXPECT_GT(generated, 6 * 8 * 32);
  EXPECT_GT(refused, 0);
}

TEST(GeneratorSweepTest, WalkDetectsADeadlock) {
  // Rank 0 waits for 0B0 before 0F1... fine; swap rank 1 so 1B0 precedes 1F0.
  absl::StatusOr<Schedule> schedule = GenerateSchedule("1f1b", {2, 2, 0});
  ASSERT_TRUE(schedule.ok()) << schedule.status();
  std::swap(schedule->programs[1][0], schedule->programs[1][1]);
  const WalkResult walk = Walk(*schedule);
  EXPECT_FALSE(walk.finished);
  EXPECT_EQ(walk.stuck, " rank 0 at 0B0 rank 1 at 1B0");
  EXPECT_FALSE(Validate(*schedule).ok());
}

double Makespan(std::string_view name, int p, int m, int v, const Costs& costs = {}) {
  absl::StatusOr<Schedule> schedule = GenerateSchedule(name, {p, m, v});
  if (!schedule.ok()) {
    ADD_FAILURE() << schedule.status();
    return -1;
  }
  const WalkResult walk = Walk(*schedule, costs);
  EXPECT_TRUE(walk.finished) << name;
  return walk.makespan;
}

TEST(GeneratorTimingTest, UniformCostsMatchTheClosedForms) {
  // T_F = 1, T_B = 2 (T_I = T_W = 1): GPipe and 1F1B take (M+P-1)(T_F+T_B); ZB-H1 cuts
  // the bubble to (P-1)(T_F+T_I-T_W), a third; interleaving V chunks (each 1/V of the
  // stage) cuts it to (P-1)(T_F+T_B)/V.
  for (int p = 1; p <= 8; ++p) {
    for (int m = p; m <= 4 * p; m += p) {
      const std::string where = absl::StrCat("P=", p, " M=", m);
      EXPECT_EQ(Makespan("gpipe", p, m, 0), 3.0 * (m + p - 1)) << where;
      EXPECT_EQ(Makespan("1f1b", p, m, 0), 3.0 * (m + p - 1)) << where;
      EXPECT_EQ(Makespan("zb-h1", p, m, 0), 3.0 * m + (p - 1)) << where;
      for (int v : {2, 4}) {
        const Costs chunk{1.0 / v, 2.0 / v, 1.0 / v, 1.0 / v};
        EXPECT_NEAR(Makespan("interleaved-1f1b", p, m, v, chunk), 3.0 * m + 3.0 * (p - 1) / v, 1e-9)
            << where << " V=" << v;
      }
    }
  }
}

TEST(GeneratorTimingTest, ZbVHasNoSteadyStateBubble) {
  // Two half-size chunks per rank, T_F = T_I = T_W = 1/2: the ideal is 3M per rank; only
  // the first forward's trip down the V is exposed.
  for (int p = 1; p <= 8; ++p) {
    for (int m = 2 * p; m <= 8 * p; m += 2 * p) {
      const Costs half{0.5, 1.0, 0.5, 0.5};
      EXPECT_EQ(Makespan("zb-v", p, m, 0, half), 3.0 * m + 0.5 * (p - 1))
          << "P=" << p << " M=" << m;
      // DualPipeV reaches the same step (its forward-backward pairs run back to back here).
      EXPECT_EQ(Makespan("dualpipe-v", p, m, 0, half), 3.0 * m + 0.5 * (p - 1))
          << "P=" << p << " M=" << m;
    }
  }
}

}  // namespace
}  // namespace pipesched::scheduler
