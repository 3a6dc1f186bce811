// Where a measured step's idle time went. Given the executor's measured Timeline (and the
// host issue time of each span, StepResult::issue_micros), every idle interval of each
// rank's compute lane is cut into five categories that add up to the rank's idle time
// as trace::ComputeBubbleStats counts it (makespan - busy). Not a model: the cut is read
// off the measured spans, with the executor's stream rules (stages/executor.h) saying
// what each compute action waits for.
//
// Window. [T0, T1]: the earliest span start and the latest span end of rows
// [0, num_rows) (the same window as ComputeBubbleStats). A row's idle intervals are the
// gaps between its consecutive compute spans, the leading gap [T0, first start) and the
// trailing gap [last end, T1).
//
// A gap [g0, g1) that ends when compute action X starts. X could not start before all of
//   p    the producer of X's input on ANOTHER row had finished: F(s-1, m) for F(s, m),
//        B/I(s+1, m) for B/I(s, m) (the cross-rank dependency; none for the first F and
//        the last stage's B, nor when the producer is on X's own row);
//   i    the host had issued X (issue_micros);
//   t    X's transfers had finished: RECV_F(s, m) for F(s, m), SEND_B(s+1, m) for
//        B/I(s, m). (The compute stream never waits for an outgoing copy: the executor
//        frees a boundary buffer on the send stream, behind its gradient copy -- except
//        with ExecutorOptions::exact_memory_accounting, whose steps this analysis
//        does not describe exactly.)
// The gap is cut at the moments these became true, in this priority:
//   [g0, p.end)                    dependency: split into (a) and (e) below;
//   [.., i)                        (d) host: the producer was done, the host had not issued;
//   [.., t)                        (b) transfer: issued, producer done, data not there yet;
//   [max(g0, p.end, i, t), g1)     the hand-off latency after the last of them: (b) when the
//                                  last was p or t (an event wake-up plus the copy), else
//                                  (d) (the stream's own issue and runtime overhead).
// The dependency part is split by what the producer's row was doing meanwhile: while it
// ran a compute span q of stage s and op o, the share eps(q) = max(0, 1 - ref(o) /
// median_s(o)) is (e) imbalance and the rest (a) pipeline bubble, where median_s(o) is the
// median duration of op o on stage s and ref(o) the mean of median_s(o) over stages (what
// every stage would take if the same work were balanced); while it was idle, all is (a).
// Trailing gap [last end, T1): (c) all-reduce until the row's own ALLREDUCE spans end;
// then (a)/(e) until the compute of the row that finishes last ends (split by that row's
// spans as above); then (b) until the last transfer ends; then (c) until the last
// all-reduce of any row ends; the rest (d).
//
// Effective hand-off latency: for each cross-rank dependency whose producer was the
// last blocker of X (p.end >= g0 and p.end >= i), X.start - p.end is one sample for the
// boundary min(s_p, s_X) (the event hand-off, the transfer and the wake-up of X's
// stream). Its median is what the simulator should use as the boundary's transfer time
// to replay this machine (WithHandoffLatency).
//
// Stream gap: for each compute action X that follows another compute action on its row
// and for which everything was ready when that one ended (p, i and t all <= g0), g1 - g0
// is X's stream gap: the runtime's own overhead between two actions of a stream (the
// "host" residual above). Their median, without those after a copy to a stage on the
// same row (zb-v's bottom: a backward's copy runs on the compute stream, in the gap), is
// CostModel::action_gap (MedianGap). Any other X that follows an action on its row had
// a stream gap of at most g1 - g0 (it waited for something else meanwhile).
#pragma once

#include <cstdint>
#include <map>
#include <tuple>
#include <vector>

#include "absl/status/statusor.h"
#include "pipesched/scheduler/cost_model.h"
#include "pipesched/scheduler/schedule.h"
#include "pipesched/trace/timeline.h"

namespace pipesched::stages {

struct IdleBreakdown {
  double dependency = 0;  // (a) waiting for a producer on another rank still computing
  double transfer = 0;    // (b) waiting for a transfer or an event hand-off
  double allreduce = 0;   // (c) waiting for the data-parallel all-reduce
  double host = 0;        // (d) the host had not issued yet, or stream overhead
  double imbalance = 0;   // (e) the producer's stage is slower than a balanced stage

  double total() const { return dependency + transfer + allreduce + host + imbalance; }
  IdleBreakdown& operator+=(const IdleBreakdown& o);
};

struct IdleAnalysis {
  double start = 0;                 // T0
  double makespan = 0;              // T1 - T0
  std::vector<double> busy;         // per row: sum of compute-span durations
  std::vector<double> idle;         // per row: makespan - busy
  std::vector<IdleBreakdown> rows;  // per row; rows[r].total() == idle[r] (to rounding)
  IdleBreakdown total;              // over rows
  // Per boundary s -> s+1: effective hand-off latency samples (see above).
  std::vector<std::vector<double>> handoff_samples;
  // Per consuming action X (stage, op, micro-batch): X.start - p.end where the data --
  // its cross-rank producer p or p's transfer -- was X's last blocker and came after X's
  // row was free (the samples above, plus those where p ended while X's row was busy
  // but the transfer did not), to replay the step's hand-offs (WithHandoffs). Not where
  // X was issued after p ended: the host's lateness would then be in the latency (the
  // transfer's own issue may have been late too), so such inputs keep the boundary's
  // median in the replay, bounded by handoff_at_most.
  std::map<std::tuple<int, scheduler::Op, int>, double> handoff_into;
  // Every other consuming action X with a cross-rank producer p: X.start - p.end, a bound
  // on its hand-off (its data cannot have taken longer), so that a replay never starts X
  // later than it started.
  std::map<std::tuple<int, scheduler::Op, int>, double> handoff_at_most;
  // Stream-gap samples (see above), over all rows, and per action X (stage, op,
  // micro-batch) its gap (copies within a row included) where it had everything when its
  // row's previous action ended, or else the bound g1 - g0 on it: to replay the step's
  // gaps (WithHandoffs).
  std::vector<double> gap_samples;
  std::map<std::tuple<int, scheduler::Op, int>, double> gap_before;
  std::map<std::tuple<int, scheduler::Op, int>, double> gap_at_most;
};

// `issue_micros`: per span of `timeline` (StepResult::issue_micros) or empty (issue
// treated as instantaneous: no (d) before the producer/transfer blockers). Rows
// [0, num_rows) are analysed (num_rows <= 0: all). InvalidArgument when issue_micros has
// the wrong size; FailedPrecondition when compute spans of one row overlap (no stream
// runs two actions at once, so the gaps would not add up to the idle time).
absl::StatusOr<IdleAnalysis> AnalyzeIdle(const trace::Timeline& timeline,
                                         const std::vector<double>& issue_micros, int num_rows = 0);

// Imbalance against a balanced pipeline. The per-instant rule above only charges the
// producer's excess while the consumer waits on it; with a slower stage the schedule's
// steady state also waits for it every micro-batch (1F1B with one stage 2x slower idles
// its other rank half of the steady state, a balanced one not at all). Given the idle
// time each rank would have if every stage took the mean of the stages' measured costs
// (`balanced_idle`, BalancedIdle below, in the timeline's units), this re-splits each
// row's dependency wait W = (a) + (e): (a) = min(W, balanced_idle[r]), (e) = W - (a).
// The other categories and the totals are unchanged.
void SplitByBalancedReference(IdleAnalysis& analysis, const std::vector<double>& balanced_idle);

// Per rank: the idle time the simulator gives `schedule` when every stage costs the mean
// of `measured`'s stage costs (F, B, I, W), with no transfer and no all-reduce time: the
// pure pipeline bubble of a balanced split of the same work.
absl::StatusOr<std::vector<double>> BalancedIdle(const scheduler::Schedule& schedule,
                                                 const scheduler::CostModel& measured);

// Median of the hand-off samples of `analyses`, per boundary; -1 where none waited.
std::vector<double> MedianHandoff(const std::vector<const IdleAnalysis*>& analyses);

// Median of the stream-gap samples of `analyses`; -1 where there are none.
double MedianGap(const std::vector<const IdleAnalysis*>& analyses);

// `costs` with each boundary's transfer time replaced by its effective hand-off latency
// where one was measured (>= 0); the measured transfer time stays elsewhere.
scheduler::CostModel WithHandoffLatency(scheduler::CostModel costs,
                                        const std::vector<double>& handoff);

// `costs` with every compute action of rows [0, num_rows) of a measured `timeline` (one
// replica) given its own measured duration (CostModel::actions): the simulator then
// replays that step action by action, and what is left between its makespan and the
// measured one is what it does not model (hand-offs beyond the boundary latency, host
// issue), not the spread of the actions' durations. A span whose duration is not finite
// and non-negative keeps the (stage, op) cost of `costs`.
scheduler::CostModel WithActionDurations(scheduler::CostModel costs,
                                         const trace::Timeline& timeline, int num_rows);

// `costs` with each stage's zero_grad and optimizer set to its own span among a measured
// step's `phases` (StepResult::phases) of rows [0, num_rows): with WithActionDurations,
// the replayed step's time (SimResult::step_time) is that step's, not the medians'.
// Stages past the end of costs.stages are added (from costs.uniform) when needed.
scheduler::CostModel WithPhaseDurations(scheduler::CostModel costs,
                                        const std::vector<trace::Span>& phases, int num_rows);

// `costs` with each cross-rank input whose hand-off latency `analysis` measured (its
// producer was the consumer's last blocker: IdleAnalysis::handoff_into) given that
// latency as its own transfer time (CostModel::transfers), each action that measured
// a stream gap (IdleAnalysis::gap_before) given that gap (CostModel::gaps); every other
// cross-rank input a hand-off, and every other action that followed one on its row a
// gap, of at most what it measured (IdleAnalysis::handoff_at_most, gap_at_most: the
// min with what `costs` gives it), so that no action of the replay starts later than
// it did. With
// WithActionDurations on the same step, the simulator replays the step's compute, its
// hand-offs and its gaps; the rest keep their boundary's time and CostModel::action_gap.
scheduler::CostModel WithHandoffs(scheduler::CostModel costs, const IdleAnalysis& analysis);

// The bubble fraction the simulator gives `schedule` on average over `draws` draws in
// which every compute action takes a duration drawn (uniformly, with replacement) from
// the durations its (stage, op) had in the measured `timeline` (rows [0, num_rows)), and
// every cross-rank input a hand-off latency drawn from its boundary's samples in
// `analysis` (the step's AnalyzeIdle), and every compute action a stream gap drawn from
// its gap samples; what `costs` says for the rest (a (stage, op) or boundary without
// samples, a step without gap samples, all-reduce). The simulator fed with medians
// underestimates the bubble of a machine whose action times spread: a pipeline waits
// for the slower of two branches, and the mean of a maximum exceeds the maximum of the
// means. Deterministic for a given `seed`. InvalidArgument for draws < 1, and whatever
// Simulate returns.
absl::StatusOr<double> SpreadBubble(const scheduler::Schedule& schedule,
                                    const scheduler::CostModel& costs,
                                    const trace::Timeline& timeline, int num_rows,
                                    const IdleAnalysis& analysis, int draws, std::uint64_t seed);

}  // namespace pipesched::stages
