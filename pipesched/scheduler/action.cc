// Text form and names of actions (PyTorch's pipelining grammar). Parsing is strict:
// anything that is not exactly <stage><op><microbatch> (or <stage>ALLREDUCE) is an
// InvalidArgument that quotes the token, so a bad schedule file points at its cell.
#include "pipesched/scheduler/action.h"

#include <array>
#include <charconv>
#include <limits>
#include <string>
#include <string_view>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "pipesched/base/strings.h"

namespace pipesched::scheduler {
namespace {

constexpr std::array<std::string_view, kNumOps> kOpNames = {
    "F", "B", "I", "W", "SEND_F", "RECV_F", "SEND_B", "RECV_B", "ALLREDUCE"};

constexpr std::string_view kGrammar =
    "expected <stage><op><microbatch> such as \"2F0\", \"3I1\", \"3W1\", \"1SEND_F4\", or "
    "<stage>ALLREDUCE or PyTorch's <stage>REDUCE_GRAD such as \"2ALLREDUCE\"; op is one of "
    "F, B, I, W, SEND_F, RECV_F, SEND_B, RECV_B";

bool IsDigit(char c) { return c >= '0' && c <= '9'; }
bool IsSpace(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r'; }

absl::Status BadToken(std::string_view token, std::string_view why) {
  // Quoted short and escaped: a token is whatever a file holds between commas (10 MB of
  // it, a NUL, a lone \r from old Mac line ends).
  return absl::InvalidArgumentError(
      absl::StrCat("bad action ", QuoteForMessage(token), ": ", Absl(why), "; ", Absl(kGrammar)));
}

// Parses a non-negative decimal int that fills `digits` exactly.
// Below INT_MAX, so that the count a file implies (largest index + 1) fits in an int.
bool ParseIndex(std::string_view digits, int* out) {
  if (digits.empty()) return false;
  const char* end = digits.data() + digits.size();
  auto [ptr, ec] = std::from_chars(digits.data(), end, *out);
  return ec == std::errc() && ptr == end && *out < std::numeric_limits<int>::max();
}

}  // namespace

std::string_view OpName(Op op) {
  const auto index = static_cast<std::size_t>(op);
  return index < kOpNames.size() ? kOpNames[index] : std::string_view("?");
}

bool IsCompute(Op op) { return op == Op::kF || op == Op::kB || op == Op::kI || op == Op::kW; }

std::string ToString(const Action& action) {
  if (action.op == Op::kAllReduce) return absl::StrCat(action.stage, "ALLREDUCE");
  return absl::StrCat(action.stage, Absl(OpName(action.op)), action.microbatch);
}

absl::StatusOr<Action> ParseAction(std::string_view text) {
  std::size_t begin = 0;
  std::size_t end = text.size();
  while (begin < end && IsSpace(text[begin])) ++begin;
  while (end > begin && IsSpace(text[end - 1])) --end;
  const std::string_view token = text.substr(begin, end - begin);
  if (token.empty()) return BadToken(token, "it is empty");

  std::size_t pos = 0;
  while (pos < token.size() && IsDigit(token[pos])) ++pos;
  const std::string_view stage_digits = token.substr(0, pos);
  std::size_t op_end = pos;
  while (op_end < token.size() && !IsDigit(token[op_end])) ++op_end;
  const std::string_view op_text = token.substr(pos, op_end - pos);
  const std::string_view mb_digits = token.substr(op_end);

  Action action;
  if (stage_digits.empty()) return BadToken(token, "it does not start with a stage number");
  if (!ParseIndex(stage_digits, &action.stage)) {
    return BadToken(token, "the stage number is too large");
  }
  if (op_text.empty()) return BadToken(token, "it has no op after the stage number");

  if (op_text.size() > 1 && op_text.back() == '-' && !mb_digits.empty()) {
    return BadToken(token, "the micro-batch number is negative; micro-batches count from 0");
  }
  if (op_text == "ALLREDUCE" || op_text == "REDUCE_GRAD") {
    if (!mb_digits.empty()) {
      return BadToken(token, absl::StrCat(Absl(op_text), " takes no micro-batch"));
    }
    action.op = Op::kAllReduce;
    action.microbatch = -1;
    return action;
  }
  bool known = false;
  for (int i = 0; i < kNumOps; ++i) {
    const Op op = static_cast<Op>(i);
    if (op != Op::kAllReduce && op_text == OpName(op)) {
      action.op = op;
      known = true;
      break;
    }
  }
  if (!known && (op_text == "UNSHARD" || op_text == "RESHARD")) {
    return BadToken(token, absl::StrCat(Absl(op_text),
                                        " is an FSDP action (parameter all-gather and release), "
                                        "which pipesched does not model: drop the UNSHARD and "
                                        "RESHARD actions (a PyTorch CSV file's are skipped)"));
  }
  if (!known) return BadToken(token, absl::StrCat("unknown op ", QuoteForMessage(op_text)));
  if (mb_digits.empty()) {
    return BadToken(token, absl::StrCat("op ", Absl(op_text), " needs a micro-batch number"));
  }
  if (!ParseIndex(mb_digits, &action.microbatch)) {
    return BadToken(token, "the micro-batch number is malformed or too large");
  }
  return action;
}

}  // namespace pipesched::scheduler
