// The schedule IR's unit: one action of one (virtual) stage on one micro-batch.
// Text form follows PyTorch's pipelining grammar: "2F0" (stage 2, forward, mb 0),
// "3I1", "3W1", "1SEND_F4"; ALLREDUCE has no micro-batch: "2ALLREDUCE".
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

#include "absl/status/statusor.h"

namespace pipesched::scheduler {

enum class Op : uint8_t {
  kF,          // forward
  kB,          // full backward (= I + W)
  kI,          // backward w.r.t. the stage input
  kW,          // backward w.r.t. the stage weights
  kSendF,      // lowered: send the forward activation to stage+1
  kRecvF,      // lowered: receive the forward activation from stage-1
  kSendB,      // lowered: send the input gradient to stage-1
  kRecvB,      // lowered: receive the output gradient from stage+1
  kAllReduce,  // data-parallel gradient reduction of one stage (no micro-batch)
};

inline constexpr int kNumOps = 9;

// "F", "B", "I", "W", "SEND_F", "RECV_F", "SEND_B", "RECV_B", "ALLREDUCE".
std::string_view OpName(Op op);
// True for F, B, I, W.
bool IsCompute(Op op);

struct Action {
  int stage = 0;       // virtual stage in [0, P*V)
  int microbatch = 0;  // in [0, M); -1 for kAllReduce
  Op op = Op::kF;

  friend bool operator==(const Action&, const Action&) = default;
};

// "2F0", "1SEND_F4", "2ALLREDUCE".
std::string ToString(const Action& action);

// Parses the text form. Also accepts PyTorch's "REDUCE_GRAD" as ALLREDUCE and
// surrounding whitespace. InvalidArgument naming the token and the grammar otherwise.
absl::StatusOr<Action> ParseAction(std::string_view text);

}  // namespace pipesched::scheduler
