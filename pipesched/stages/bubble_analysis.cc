// Idle-time decomposition of a measured step (stages/bubble_analysis.h).
#include "pipesched/stages/bubble_analysis.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <map>
#include <optional>
#include <random>
#include <string>
#include <tuple>

#include "absl/strings/str_cat.h"
#include "pipesched/base/status.h"
#include "pipesched/scheduler/simulator.h"

namespace pipesched::stages {
namespace {

constexpr double kNever = -std::numeric_limits<double>::infinity();

enum Kind { kF, kBI, kW, kRecvF, kSendB, kRecvB, kOther };

Kind KindOf(const trace::Span& s) {
  if (s.op == "F") return kF;
  if (s.op == "B" || s.op == "I") return kBI;
  if (s.op == "W") return kW;
  if (s.op == "RECV_F") return kRecvF;
  if (s.op == "SEND_B") return kSendB;
  if (s.op == "RECV_B") return kRecvB;  // a gradient from another process (its receive)
  return kOther;
}

// The compute op a span of a compute lane stands for.
std::optional<scheduler::Op> ComputeOpOf(const trace::Span& s) {
  for (scheduler::Op op :
       {scheduler::Op::kF, scheduler::Op::kB, scheduler::Op::kI, scheduler::Op::kW}) {
    if (s.op == scheduler::OpName(op)) return op;
  }
  return std::nullopt;
}

double Median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const std::size_t n = v.size();
  return n % 2 == 1 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

double Clamp(double t, double lo, double hi) { return std::min(std::max(t, lo), hi); }

class Analyzer {
 public:
  Analyzer(const trace::Timeline& timeline, const std::vector<double>& issue, int rows)
      : tl_(timeline), issue_(issue), rows_(rows) {}

  absl::StatusOr<IdleAnalysis> Run();

 private:
  const trace::Span* Find(Kind kind, int stage, int mb) const {
    auto it = index_.find({kind, stage, mb});
    return it == index_.end() ? nullptr : &tl_.spans[it->second];
  }
  double Issue(int span) const { return issue_.empty() ? kNever : issue_[span]; }
  // Whether compute span `q` is a B/I(s) whose input gradient goes to stage s-1 on its own
  // row (zb-v's bottom): that copy runs on the compute stream right behind it, in the gap
  // after it. (A forward copy within a row runs right before its consumer F, which waits
  // for it as its transfer.)
  bool CopiesWithinRow(const trace::Span& q) const {
    if (KindOf(q) != kBI) return false;
    const trace::Span* consumer = Find(kF, q.stage - 1, q.microbatch);
    return consumer != nullptr && consumer->rank == q.rank;
  }
  // Adds [lo, hi) of waiting for row `row`'s compute to `out`: imbalance by the share
  // eps of each of its spans overlapping the interval, the rest pipeline bubble.
  void SplitDependency(int row, double lo, double hi, IdleBreakdown& out) const;
  double Eps(const trace::Span& q) const;

  const trace::Timeline& tl_;
  const std::vector<double>& issue_;
  int rows_;
  std::map<std::tuple<int, int, int>, int> index_;  // (kind, stage, mb) -> span
  std::vector<std::vector<int>> compute_;           // per row: compute spans by start
  // Per row: the latest end among compute_[row][0..i], non-decreasing, so that the spans
  // overlapping an interval are found by binary search (O(N log N) for a whole step, not
  // O(N^2): 65536 micro-batches took minutes).
  std::vector<std::vector<double>> max_end_;
  std::map<std::pair<int, std::string>, double> stage_median_;  // (stage, op)
  std::map<std::string, double> reference_;                     // op -> mean over stages
};

double Analyzer::Eps(const trace::Span& q) const {
  auto m = stage_median_.find({q.stage, q.op});
  auto r = reference_.find(q.op);
  if (m == stage_median_.end() || r == reference_.end() || m->second <= 0) return 0;
  return std::max(0.0, 1.0 - r->second / m->second);
}

void Analyzer::SplitDependency(int row, double lo, double hi, IdleBreakdown& out) const {
  if (hi <= lo) return;
  double imbalance = 0;
  const std::vector<int>& spans = compute_[row];
  const std::vector<double>& max_end = max_end_[row];
  // Spans before the first whose running max end passes lo all end by lo.
  auto first = std::upper_bound(max_end.begin(), max_end.end(), lo);
  for (std::size_t i = first - max_end.begin(); i < spans.size(); ++i) {
    const trace::Span& q = tl_.spans[spans[i]];
    if (q.start >= hi) break;  // sorted by start: no later span overlaps
    const double overlap = std::min(hi, q.end) - std::max(lo, q.start);
    if (overlap > 0) imbalance += Eps(q) * overlap;
  }
  imbalance = std::min(imbalance, hi - lo);
  out.imbalance += imbalance;
  out.dependency += (hi - lo) - imbalance;
}

absl::StatusOr<IdleAnalysis> Analyzer::Run() {
  IdleAnalysis result;
  if (!issue_.empty() && issue_.size() != tl_.spans.size()) {
    return absl::InvalidArgumentError(absl::StrCat("issue times: ", issue_.size(), " for ",
                                                   tl_.spans.size(), " spans; give one per span"));
  }
  rows_ = rows_ > 0 ? std::min(rows_, tl_.num_ranks) : tl_.num_ranks;
  if (rows_ <= 0) return result;
  compute_.assign(rows_, {});
  double t0 = std::numeric_limits<double>::infinity(), t1 = kNever;
  std::map<std::pair<int, std::string>, std::vector<double>> durations;
  int num_stages = 0;
  for (int k = 0; k < static_cast<int>(tl_.spans.size()); ++k) {
    const trace::Span& s = tl_.spans[k];
    if (s.rank < 0 || s.rank >= rows_) continue;
    t0 = std::min(t0, s.start);
    t1 = std::max(t1, s.end);
    const Kind kind = KindOf(s);
    if (kind != kOther) index_[{kind, s.stage, s.microbatch}] = k;
    if (s.lane == trace::kComputeLane) {
      compute_[s.rank].push_back(k);
      durations[{s.stage, s.op}].push_back(s.end - s.start);
      num_stages = std::max(num_stages, s.stage + 1);
    }
  }
  result.busy.assign(rows_, 0);
  result.idle.assign(rows_, 0);
  result.rows.assign(rows_, {});
  result.handoff_samples.assign(std::max(num_stages - 1, 0), {});
  if (t1 < t0) return result;
  result.start = t0;
  result.makespan = t1 - t0;
  std::map<std::string, std::pair<double, int>> sums;
  for (const auto& [key, v] : durations) {
    const double m = Median(v);
    stage_median_[key] = m;
    sums[key.second].first += m;
    sums[key.second].second += 1;
  }
  for (const auto& [op, sum] : sums) reference_[op] = sum.first / sum.second;

  std::vector<double> last_end(rows_, kNever);
  max_end_.assign(rows_, {});
  for (int r = 0; r < rows_; ++r) {
    std::vector<int>& spans = compute_[r];
    std::sort(spans.begin(), spans.end(),
              [&](int a, int b) { return tl_.spans[a].start < tl_.spans[b].start; });
    if (!spans.empty()) last_end[r] = tl_.spans[spans.back()].end;
    double running = kNever;
    for (int k : spans) {
      running = std::max(running, tl_.spans[k].end);
      max_end_[r].push_back(running);
    }
  }
  // Latest end of transfers and of all-reduces (per row and overall), for trailing gaps.
  double transfer_end = kNever, allreduce_end = kNever;
  std::vector<double> own_allreduce_end(rows_, kNever);
  for (const trace::Span& s : tl_.spans) {
    if (s.rank < 0 || s.rank >= rows_) continue;
    if (s.op == "ALLREDUCE") {
      allreduce_end = std::max(allreduce_end, s.end);
      own_allreduce_end[s.rank] = std::max(own_allreduce_end[s.rank], s.end);
    } else if (s.lane != trace::kComputeLane) {
      transfer_end = std::max(transfer_end, s.end);
    }
  }

  for (int r = 0; r < rows_; ++r) {
    IdleBreakdown& out = result.rows[r];
    double busy = 0;
    double g0 = t0;
    const trace::Span* prev = nullptr;
    for (int k : compute_[r]) {
      const trace::Span& x = tl_.spans[k];
      busy += x.end - x.start;
      if (x.start < g0 && prev != nullptr) {
        return absl::FailedPreconditionError(
            absl::StrCat("row ", r, ": ", prev->op, "(", prev->stage, ",", prev->microbatch,
                         ") and ", x.op, "(", x.stage, ",", x.microbatch,
                         ") overlap on the compute lane; a stream runs one action at a time"));
      }
      const double g1 = x.start;
      // Blockers of x.
      const trace::Span* producer = nullptr;
      double t_ready = kNever;
      const Kind kind = KindOf(x);
      if (kind == kF && x.stage > 0) {
        producer = Find(kF, x.stage - 1, x.microbatch);
        if (const trace::Span* t = Find(kRecvF, x.stage, x.microbatch)) t_ready = t->end;
      } else if (kind == kBI) {
        producer = Find(kBI, x.stage + 1, x.microbatch);
        // From another process (ExecutorOptions::pipeline) the gradient is there when its
        // receive ends; the sender's SEND_B only posted it.
        if (const trace::Span* t = Find(kRecvB, x.stage, x.microbatch)) {
          t_ready = t->end;
        } else if (const trace::Span* t = Find(kSendB, x.stage + 1, x.microbatch)) {
          t_ready = t->end;
        }
      }
      if (producer != nullptr && producer->rank == r) producer = nullptr;
      const double p_end = producer != nullptr ? producer->end : kNever;
      const double issued = Issue(k);
      // Cut points, non-decreasing, clamped to the gap.
      const double c1 = Clamp(p_end, g0, g1);
      const double c2 = Clamp(std::max(p_end, issued), g0, g1);
      const double c3 = Clamp(std::max({p_end, issued, t_ready}), g0, g1);
      if (producer != nullptr) SplitDependency(producer->rank, g0, c1, out);
      out.host += c2 - c1;
      out.transfer += c3 - c2;
      const bool data_last =
          std::max(p_end, t_ready) > kNever && std::max(p_end, t_ready) >= std::max(g0, issued);
      (data_last ? out.transfer : out.host) += g1 - c3;
      if (producer != nullptr && p_end >= g0 && p_end >= issued && p_end <= g1) {
        const int boundary = std::min(producer->stage, x.stage);
        if (boundary >= 0 && boundary < static_cast<int>(result.handoff_samples.size())) {
          result.handoff_samples[boundary].push_back(g1 - p_end);
        }
      }
      // X's own hand-off: also when its producer finished while X's row was still busy
      // but the data (the transfer) came after that, the last blocker.
      if (producer != nullptr && data_last && p_end >= issued && p_end <= g1 &&
          std::max(p_end, t_ready) >= g0) {
        if (std::optional<scheduler::Op> op = ComputeOpOf(x)) {
          result.handoff_into[{x.stage, *op, x.microbatch}] = g1 - p_end;
        }
      } else if (producer != nullptr) {
        // (Below 0 where X's clock read an instant before p's: rows on different devices
        // may disagree by a few microseconds.)
        if (std::optional<scheduler::Op> op = ComputeOpOf(x)) {
          result.handoff_at_most[{x.stage, *op, x.microbatch}] = std::max(0.0, g1 - p_end);
        }
      }
      // The stream's own gap: everything X needed was there when the previous action ended.
      if (prev != nullptr) {
        const std::optional<scheduler::Op> op = ComputeOpOf(x);
        if (std::max({p_end, t_ready, issued}) <= g0) {
          if (!CopiesWithinRow(*prev)) result.gap_samples.push_back(g1 - g0);
          if (op) result.gap_before[{x.stage, *op, x.microbatch}] = g1 - g0;
        } else if (op) {
          result.gap_at_most[{x.stage, *op, x.microbatch}] = g1 - g0;
        }
      }
      g0 = x.end;
      prev = &x;
    }
    // Trailing gap [g0, t1).
    int critical = -1;
    for (int o = 0; o < rows_; ++o) {
      if (o != r && (critical < 0 || last_end[o] > last_end[critical])) critical = o;
    }
    const double c1 = Clamp(own_allreduce_end[r], g0, t1);
    const double c2 = critical >= 0 ? Clamp(last_end[critical], c1, t1) : c1;
    const double c3 = Clamp(transfer_end, c2, t1);
    const double c4 = Clamp(allreduce_end, c3, t1);
    out.allreduce += c1 - g0;
    if (critical >= 0) SplitDependency(critical, c1, c2, out);
    out.transfer += c3 - c2;
    out.allreduce += c4 - c3;
    out.host += t1 - c4;
    result.busy[r] = busy;
    result.idle[r] = std::max(0.0, result.makespan - busy);
    result.total += out;
  }
  return result;
}

}  // namespace

IdleBreakdown& IdleBreakdown::operator+=(const IdleBreakdown& o) {
  dependency += o.dependency;
  transfer += o.transfer;
  allreduce += o.allreduce;
  host += o.host;
  imbalance += o.imbalance;
  return *this;
}

absl::StatusOr<IdleAnalysis> AnalyzeIdle(const trace::Timeline& timeline,
                                         const std::vector<double>& issue_micros, int num_rows) {
  return Analyzer(timeline, issue_micros, num_rows).Run();
}

void SplitByBalancedReference(IdleAnalysis& analysis, const std::vector<double>& balanced_idle) {
  analysis.total = {};
  for (std::size_t r = 0; r < analysis.rows.size(); ++r) {
    IdleBreakdown& row = analysis.rows[r];
    if (r < balanced_idle.size()) {
      const double wait = row.dependency + row.imbalance;
      row.dependency = std::min(wait, std::max(0.0, balanced_idle[r]));
      row.imbalance = wait - row.dependency;
    }
    analysis.total += row;
  }
}

absl::StatusOr<std::vector<double>> BalancedIdle(const scheduler::Schedule& schedule,
                                                 const scheduler::CostModel& measured) {
  scheduler::StageCosts mean{.f = 0, .b = 0, .i = 0, .w = 0};
  const double n = static_cast<double>(std::max<std::size_t>(measured.stages.size(), 1));
  for (const scheduler::StageCosts& c : measured.stages) {
    mean.f += c.f / n;
    mean.b += c.b / n;
    mean.i += c.i / n;
    mean.w += c.w / n;
  }
  if (measured.stages.empty()) mean = measured.uniform;
  mean.allreduce = 0;
  scheduler::CostModel balanced;
  balanced.uniform = mean;
  PS_ASSIGN_OR_RETURN(scheduler::SimResult sim, scheduler::Simulate(schedule, balanced));
  std::vector<double> idle;
  for (const scheduler::RankStats& r : sim.ranks) idle.push_back(r.idle);
  return idle;
}

std::vector<double> MedianHandoff(const std::vector<const IdleAnalysis*>& analyses) {
  std::vector<std::vector<double>> pooled;
  for (const IdleAnalysis* a : analyses) {
    if (a == nullptr) continue;
    if (pooled.size() < a->handoff_samples.size()) pooled.resize(a->handoff_samples.size());
    for (std::size_t b = 0; b < a->handoff_samples.size(); ++b) {
      pooled[b].insert(pooled[b].end(), a->handoff_samples[b].begin(), a->handoff_samples[b].end());
    }
  }
  std::vector<double> out;
  for (const auto& v : pooled) out.push_back(v.empty() ? -1 : Median(v));
  return out;
}

double MedianGap(const std::vector<const IdleAnalysis*>& analyses) {
  std::vector<double> pooled;
  for (const IdleAnalysis* a : analyses) {
    if (a != nullptr) pooled.insert(pooled.end(), a->gap_samples.begin(), a->gap_samples.end());
  }
  return pooled.empty() ? -1 : Median(std::move(pooled));
}

scheduler::CostModel WithHandoffLatency(scheduler::CostModel costs,
                                        const std::vector<double>& handoff) {
  if (costs.comm.size() < handoff.size()) costs.comm.resize(handoff.size(), costs.comm_uniform);
  for (std::size_t b = 0; b < handoff.size(); ++b) {
    if (handoff[b] >= 0) costs.comm[b] = handoff[b];
  }
  return costs;
}

scheduler::CostModel WithActionDurations(scheduler::CostModel costs,
                                         const trace::Timeline& timeline, int num_rows) {
  for (const trace::Span& s : timeline.spans) {
    if (s.rank < 0 || s.rank >= num_rows || s.lane != trace::kComputeLane) continue;
    const double duration = s.end - s.start;
    if (!(duration >= 0) || !std::isfinite(duration)) continue;  // not a measurement
    if (std::optional<scheduler::Op> op = ComputeOpOf(s)) {
      costs.actions[{s.stage, *op, s.microbatch}] = duration;
    }
  }
  return costs;
}

scheduler::CostModel WithPhaseDurations(scheduler::CostModel costs,
                                        const std::vector<trace::Span>& phases, int num_rows) {
  for (const trace::Span& s : phases) {
    if (s.rank < 0 || s.rank >= num_rows || s.stage < 0) continue;
    if (static_cast<std::size_t>(s.stage) >= costs.stages.size()) {
      costs.stages.resize(s.stage + 1, costs.uniform);
    }
    scheduler::StageCosts& c = costs.stages[s.stage];
    if (s.op == "ZERO_GRAD") c.zero_grad = s.end - s.start;
    if (s.op == "OPTIMIZER") c.optimizer = s.end - s.start;
  }
  return costs;
}

scheduler::CostModel WithHandoffs(scheduler::CostModel costs, const IdleAnalysis& analysis) {
  for (const auto& [key, latency] : analysis.handoff_into) costs.transfers[key] = latency;
  for (const auto& [key, bound] : analysis.handoff_at_most) {
    const auto& [stage, op, microbatch] = key;
    auto it = costs.transfers.find(key);
    // The cross-rank input of F(s) crosses boundary s-1, of B/I(s) boundary s.
    const double latency = it != costs.transfers.end()
                               ? it->second
                               : costs.Comm(op == scheduler::Op::kF ? stage - 1 : stage);
    costs.transfers[key] = std::min(latency, bound);
  }
  for (const auto& [key, gap] : analysis.gap_before) costs.gaps[key] = gap;
  for (const auto& [key, bound] : analysis.gap_at_most) {
    auto it = costs.gaps.find(key);
    const double gap = it != costs.gaps.end() ? it->second : costs.action_gap;
    costs.gaps[key] = std::min(gap, bound);
  }
  return costs;
}

absl::StatusOr<double> SpreadBubble(const scheduler::Schedule& schedule,
                                    const scheduler::CostModel& costs,
                                    const trace::Timeline& timeline, int num_rows,
                                    const IdleAnalysis& analysis, int draws, std::uint64_t seed) {
  if (draws <= 0) return absl::InvalidArgumentError("SpreadBubble needs draws >= 1");
  // The samples: compute durations per (stage, op), hand-off latencies per boundary.
  std::map<std::pair<int, scheduler::Op>, std::vector<double>> durations;
  for (const trace::Span& s : timeline.spans) {
    if (s.rank < 0 || s.rank >= num_rows || s.lane != trace::kComputeLane) continue;
    if (std::optional<scheduler::Op> op = ComputeOpOf(s)) {
      durations[{s.stage, *op}].push_back(s.end - s.start);
    }
  }
  const std::vector<std::vector<double>>& handoffs = analysis.handoff_samples;
  const std::vector<double>& gaps = analysis.gap_samples;
  std::mt19937_64 rng(seed);
  auto draw = [&rng](const std::vector<double>& v) {
    return v[std::uniform_int_distribution<std::size_t>(0, v.size() - 1)(rng)];
  };
  double sum = 0;
  scheduler::CostModel drawn = costs;
  for (int k = 0; k < draws; ++k) {
    drawn.actions.clear();
    drawn.transfers.clear();
    drawn.gaps.clear();
    for (int r = 0; r < schedule.num_ranks(); ++r) {
      for (const scheduler::Action& a : schedule.programs[r]) {
        if (!scheduler::IsCompute(a.op)) continue;
        auto it = durations.find({a.stage, a.op});
        if (it != durations.end()) drawn.actions[{a.stage, a.op, a.microbatch}] = draw(it->second);
        if (!gaps.empty()) drawn.gaps[{a.stage, a.op, a.microbatch}] = draw(gaps);
        // The cross-rank input of F(s) crosses boundary s-1, of B/I(s) boundary s.
        const int boundary = a.op == scheduler::Op::kF ? a.stage - 1 : a.stage;
        if (a.op != scheduler::Op::kW && boundary >= 0 &&
            boundary < static_cast<int>(handoffs.size()) && !handoffs[boundary].empty()) {
          drawn.transfers[{a.stage, a.op, a.microbatch}] = draw(handoffs[boundary]);
        }
      }
    }
    PS_ASSIGN_OR_RETURN(scheduler::SimResult sim, scheduler::Simulate(schedule, drawn));
    sum += sim.bubble_fraction;
  }
  return sum / draws;
}

}  // namespace pipesched::stages
