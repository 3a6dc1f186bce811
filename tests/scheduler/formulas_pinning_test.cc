// Pins the simulator to the closed forms of formulas.h: the registry's generators,
// simulated with uniform costs and no transfer time, must waste exactly the bubble the
// formulas predict and stash exactly the activations the papers count. A failure here
// means a generator, the simulator or a formula drifted.
#include <algorithm>
#include <cmath>
#include <optional>
#include <string>
#include <utility>

#include "absl/strings/str_format.h"
#include "gtest/gtest.h"
#include "pipesched/scheduler/cost_model.h"
#include "pipesched/scheduler/formulas.h"
#include "pipesched/scheduler/registry.h"
#include "pipesched/scheduler/simulator.h"
#include "testing/status_matchers.h"

namespace pipesched::scheduler {
namespace {

constexpr double kTol = 1e-12;

absl::StatusOr<SimResult> GenerateAndSimulate(const std::string& name, int p, int v, int m,
                                              const CostModel& costs = CostModel{}) {
  absl::StatusOr<Schedule> schedule = GenerateSchedule(
      name, GeneratorParams{.num_ranks = p, .num_microbatches = m, .num_chunks = v});
  if (!schedule.ok()) return schedule.status();
  return Simulate(*schedule, costs);
}

double TotalIdle(const SimResult& r) {
  double idle = 0;
  for (const RankStats& rank : r.ranks) idle += rank.idle;
  return idle;
}

TEST(FormulasPinningTest, GPipeAnd1F1BMatchFillAndDrainExactly) {
  for (const std::string name : {"gpipe", "1f1b"}) {
    for (int p = 1; p <= 8; ++p) {
      for (int m = 1; m <= 16; ++m) {
        SCOPED_TRACE(name + " P=" + std::to_string(p) + " M=" + std::to_string(m));
        PS_ASSERT_OK_AND_ASSIGN(const SimResult r, GenerateAndSimulate(name, p, 1, m));
        const double expected = (p - 1.0) / (m + p - 1.0);
        EXPECT_NEAR(r.bubble_fraction, expected, kTol);
        const FormulaInputs in{.num_ranks = p, .num_chunks = 1, .num_microbatches = m, .costs = {}};
        EXPECT_NEAR(r.bubble_fraction, *ClosedFormBubbleFraction(name, in), kTol);
        EXPECT_NEAR(r.bubble_ratio, *ClosedFormBubbleRatio(name, in), kTol);
        EXPECT_DOUBLE_EQ(r.makespan, (m + p - 1) * 3.0);  // (M+P-1)(T_F+T_B)
      }
    }
  }
}

TEST(FormulasPinningTest, PeakLiveActivations) {
  CostModel costs;
  costs.uniform.activation_bytes = 10;
  for (int p = 1; p <= 8; ++p) {
    for (int m = 1; m <= 16; ++m) {
      SCOPED_TRACE("P=" + std::to_string(p) + " M=" + std::to_string(m));
      PS_ASSERT_OK_AND_ASSIGN(const SimResult one_f_one_b,
                              GenerateAndSimulate("1f1b", p, 1, m, costs));
      PS_ASSERT_OK_AND_ASSIGN(const SimResult gpipe, GenerateAndSimulate("gpipe", p, 1, m, costs));
      for (int r = 0; r < p; ++r) {
        EXPECT_EQ(one_f_one_b.ranks[r].peak_live_microbatches, std::min(p - r, m)) << "rank " << r;
        EXPECT_EQ(one_f_one_b.ranks[r].peak_live_bytes, 10 * std::min(p - r, m)) << "rank " << r;
        EXPECT_EQ(gpipe.ranks[r].peak_live_microbatches, m) << "rank " << r;
      }
    }
  }
}

TEST(FormulasPinningTest, InterleavedBeats1F1BAndMatchesItsClosedForm) {
  for (int p = 2; p <= 8; p *= 2) {
    for (int v = 2; v <= 4; v *= 2) {
      for (int m = p; m <= 16; m += p) {
        SCOPED_TRACE("P=" + std::to_string(p) + " V=" + std::to_string(v) +
                     " M=" + std::to_string(m));
        PS_ASSERT_OK_AND_ASSIGN(const SimResult inter,
                                GenerateAndSimulate("interleaved-1f1b", p, v, m));
        PS_ASSERT_OK_AND_ASSIGN(const SimResult plain, GenerateAndSimulate("1f1b", p, 1, m));
        EXPECT_LT(inter.bubble_fraction, plain.bubble_fraction);
        const FormulaInputs in{.num_ranks = p, .num_chunks = v, .num_microbatches = m, .costs = {}};
        EXPECT_NEAR(inter.bubble_fraction, *ClosedFormBubbleFraction("interleaved-1f1b", in), kTol);
        EXPECT_NEAR(inter.bubble_ratio, (p - 1.0) / (v * m), kTol);
      }
    }
  }
}

TEST(FormulasPinningTest, ZbH1BubbleIsAThirdOf1F1BsWithEqualFIW) {
  CostModel costs;
  costs.uniform = StageCosts{.f = 1, .b = 2, .i = 1, .w = 1};
  for (int p = 2; p <= 8; ++p) {
    for (int m = p; m <= 16; ++m) {
      SCOPED_TRACE("P=" + std::to_string(p) + " M=" + std::to_string(m));
      PS_ASSERT_OK_AND_ASSIGN(const SimResult zb, GenerateAndSimulate("zb-h1", p, 1, m, costs));
      PS_ASSERT_OK_AND_ASSIGN(const SimResult plain, GenerateAndSimulate("1f1b", p, 1, m, costs));
      EXPECT_NEAR(TotalIdle(zb), TotalIdle(plain) / 3, kTol);
      for (const RankStats& rank : zb.ranks) EXPECT_NEAR(rank.idle, p - 1.0, kTol);
      const FormulaInputs in{
          .num_ranks = p, .num_chunks = 1, .num_microbatches = m, .costs = costs.uniform};
      EXPECT_NEAR(zb.bubble_fraction, *ClosedFormBubbleFraction("zb-h1", in), kTol);
    }
  }
}

// Interleaved ZB against interleaved 1F1B, both with T_F = T_I = T_W = 1 per chunk
// (T_B = 2): every rank idles exactly P-1 (interleaved 1F1B: 3(P-1) when M is a multiple
// of P), and every rank holds min((V-1)R + P, V*M) chunk activations (R = the round
// size), never more than interleaved 1F1B's busiest rank.
TEST(FormulasPinningTest, InterleavedZbIdlesPMinus1AndHoldsLessThanInterleaved1F1B) {
  CostModel costs;
  costs.uniform = StageCosts{.f = 1, .b = 2, .i = 1, .w = 1, .activation_bytes = 10};
  for (int p = 1; p <= 8; ++p) {
    for (int v = 2; v <= 4; ++v) {
      for (int m = p; m <= 3 * p; ++m) {
        SCOPED_TRACE(absl::StrFormat("P=%d V=%d M=%d", p, v, m));
        absl::StatusOr<SimResult> zb = GenerateAndSimulate("interleaved-zb", p, v, m, costs);
        if (!zb.ok()) continue;  // uneven rounds
        PS_ASSERT_OK_AND_ASSIGN(const SimResult inter,
                                GenerateAndSimulate("interleaved-1f1b", p, v, m, costs));
        const int round = m / std::max(1, m / p);
        int inter_peak = 0;
        for (const RankStats& rank : inter.ranks) {
          inter_peak = std::max(inter_peak, rank.peak_live_microbatches);
        }
        for (int r = 0; r < p; ++r) {
          EXPECT_NEAR(zb->ranks[r].idle, p - 1.0, kTol) << "rank " << r;
          EXPECT_EQ(zb->ranks[r].peak_live_microbatches, std::min((v - 1) * round + p, v * m))
              << "rank " << r;
          EXPECT_EQ(zb->ranks[r].peak_live_bytes, 10 * zb->ranks[r].peak_live_microbatches);
          EXPECT_LE(zb->ranks[r].peak_live_microbatches, inter_peak) << "rank " << r;
        }
        if (p > 1) {
          EXPECT_LT(zb->bubble_fraction, inter.bubble_fraction);
        }
        if (m % p == 0) {
          for (const RankStats& rank : inter.ranks) EXPECT_NEAR(rank.idle, 3.0 * (p - 1), kTol);
        }
      }
    }
  }
}

// The costs every sweep below runs over: zeros, fractions that are not dyadic, and a
// cost much larger than the others.
constexpr double kSweepCosts[] = {0, 0.5, 1.0 / 3, 1, 1.5, 2, 3};

// The zero-bubble closed form, (P-1)(T_F + T_I - T_W) idle per rank, against the
// simulator over a grid of F, I, W, P and M, for ZB-H1 and for interleaved ZB with 2 and
// 3 chunks: it is offered exactly where it equals the simulation, i.e. P = 1, or
// M >= P and T_W <= min(T_F, T_I), or for ZB-H1 also T_W = 0 (formulas.cc says why).
TEST(FormulasPinningTest, ZeroBubbleClosedFormIsOfferedExactlyWhereItHolds) {
  for (const auto& [name, chunks] :
       {std::pair<std::string, int>{"zb-h1", 1}, {"interleaved-zb", 2}, {"interleaved-zb", 3}}) {
    int offered = 0;
    for (int p = 1; p <= 6; ++p) {
      for (int m = 1; m <= 10; ++m) {
        absl::StatusOr<Schedule> schedule = GenerateSchedule(
            name, GeneratorParams{.num_ranks = p, .num_microbatches = m, .num_chunks = chunks});
        if (!schedule.ok()) continue;  // interleaved-zb's uneven rounds
        for (double f : kSweepCosts) {
          for (double i : kSweepCosts) {
            for (double w : kSweepCosts) {
              CostModel costs;
              costs.uniform = StageCosts{.f = f, .b = i + w, .i = i, .w = w};
              PS_ASSERT_OK_AND_ASSIGN(const SimResult r, Simulate(*schedule, costs));
              const double closed_makespan = chunks * m * (f + i + w) + (p - 1) * (f + i - w);
              const bool holds = r.makespan > 0 && std::abs(r.makespan - closed_makespan) < 1e-9;
              const std::optional<double> formula =
                  ClosedFormBubbleFraction(name, {.num_ranks = p,
                                                  .num_chunks = chunks,
                                                  .num_microbatches = m,
                                                  .costs = costs.uniform});
              SCOPED_TRACE(
                  absl::StrFormat("%s V=%d P=%d M=%d F=%g I=%g W=%g: simulated makespan %g", name,
                                  chunks, p, m, f, i, w, r.makespan));
              ASSERT_EQ(formula.has_value(), holds);
              if (!formula.has_value()) continue;
              ++offered;
              EXPECT_NEAR(*formula, r.bubble_fraction, 1e-12);
            }
          }
        }
      }
    }
    EXPECT_GT(offered, 1000) << name << " V=" << chunks;
  }
}

// GPipe, 1F1B and interleaved 1F1B over the same grid of F and B, zeros included:
// wherever a closed form is offered, it is the simulated bubble fraction; interleaved
// 1F1B's is offered wherever it holds.
TEST(FormulasPinningTest, FillDrainAndInterleavedHoldForAnyUniformCosts) {
  int offered = 0;
  int offered_off_multiple = 0;  // interleaved-1f1b at an M that is not a multiple of P
  for (const std::string name : {"gpipe", "1f1b", "interleaved-1f1b"}) {
    for (int v = 1; v <= 3; ++v) {
      if (v > 1 && name != "interleaved-1f1b") continue;
      for (int p = 1; p <= 6; ++p) {
        for (int m = 1; m <= 12; ++m) {
          absl::StatusOr<Schedule> schedule = GenerateSchedule(
              name, GeneratorParams{.num_ranks = p, .num_microbatches = m, .num_chunks = v});
          if (!schedule.ok()) continue;  // a combination the generator does not take
          for (double f : kSweepCosts) {
            for (double b : kSweepCosts) {
              CostModel costs;
              costs.uniform = StageCosts{.f = f, .b = b};
              PS_ASSERT_OK_AND_ASSIGN(const SimResult r, Simulate(*schedule, costs));
              const std::optional<double> formula =
                  ClosedFormBubbleFraction(name, {.num_ranks = p,
                                                  .num_chunks = schedule->num_chunks(),
                                                  .num_microbatches = m,
                                                  .costs = costs.uniform});
              if (name == "interleaved-1f1b" && f + b > 0) {
                // Offered exactly where it holds: M >= P in equal rounds, or P = 1 (not
                // only M a multiple of P, as Megatron states it).
                const double ratio = (p - 1.0) / (schedule->num_chunks() * m);
                const bool holds = std::abs(r.bubble_fraction - ratio / (1 + ratio)) < 1e-12;
                EXPECT_EQ(formula.has_value(), holds) << absl::StrFormat(
                    "V=%d P=%d M=%d F=%g B=%g: simulated %.6f", v, p, m, f, b, r.bubble_fraction);
                if (holds && m % p != 0) ++offered_off_multiple;
              }
              if (!formula.has_value()) continue;
              ++offered;
              EXPECT_NEAR(*formula, r.bubble_fraction, 1e-12)
                  << absl::StrFormat("%s V=%d P=%d M=%d F=%g B=%g", name, v, p, m, f, b);
            }
          }
        }
      }
    }
  }
  EXPECT_GT(offered, 3000);
  EXPECT_GT(offered_off_multiple, 100);
}

}  // namespace
}  // namespace pipesched::scheduler
