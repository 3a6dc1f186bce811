// Groups of a job's processes (CreateGroupBootstrap, SplitJob): a group's exchanges are
// the job's point-to-point messages between its members, on channels of the group's own.
#include <algorithm>
#include <atomic>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/cord.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "pipesched/base/bytes.h"
#include "pipesched/base/hash.h"
#include "pipesched/base/status.h"
#include "pipesched/base/strings.h"
#include "pipesched/comm/bootstrap.h"
#include "pipesched/comm/internal.h"

namespace pipesched::comm {
namespace {

constexpr std::size_t kMaxGroupName = 16;

// The payload that marks a failure AgreeOnVerdict made every process return.
constexpr absl::string_view kHeardByAllUrl = "pipesched/heard-by-all";

bool IsGroupName(std::string_view name) {
  return !name.empty() && name.size() <= kMaxGroupName &&
         std::all_of(name.begin(), name.end(), [](char c) {
           return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9');
         });
}

class GroupBootstrap final : public Bootstrap {
 public:
  GroupBootstrap(Bootstrap& job, std::vector<int> members, std::string name, int rank)
      : job_(job), members_(std::move(members)), name_(std::move(name)), rank_(rank) {
    Fnv1a64 id;
    id.AddField(name_);
    for (int m : members_) id.AddField(absl::StrCat(m));
    const std::uint64_t value = id.value();
    id_.assign(reinterpret_cast<const char*>(&value), sizeof(value));
  }

  std::string_view kind() const override { return job_.kind(); }
  int rank() const override { return rank_; }
  int size() const override { return static_cast<int>(members_.size()); }
  int job_rank(int rank) const override {
    return rank >= 0 && rank < size() ? job_.job_rank(members_[rank]) : rank;
  }

  absl::StatusOr<std::vector<std::string>> AllGather(std::string_view channel,
                                                     std::string_view bytes) override {
    PS_RETURN_IF_ERROR(internal::CheckChannel(channel));
    PS_RETURN_IF_ERROR(CheckOpen());
    return Gather(JobChannel('g', channel), bytes, channel);
  }

  absl::Status Send(int to, std::string_view channel, std::string_view bytes) override {
    PS_RETURN_IF_ERROR(internal::CheckChannel(channel));
    PS_RETURN_IF_ERROR(internal::CheckPeer(to, rank_, size()));
    PS_RETURN_IF_ERROR(CheckOpen());
    return job_.Send(members_[to], JobChannel('p', channel), bytes);
  }

  absl::StatusOr<std::string> Receive(int from, std::string_view channel) override {
    PS_RETURN_IF_ERROR(internal::CheckChannel(channel));
    PS_RETURN_IF_ERROR(internal::CheckPeer(from, rank_, size()));
    PS_RETURN_IF_ERROR(CheckOpen());
    absl::StatusOr<std::string> got = job_.Receive(members_[from], JobChannel('p', channel));
    if (!got.ok()) return InGroup(got.status(), channel);
    return got;
  }

  // The job's: a group's waits are the job's Receives, which only the job's Abort ends.
  void Abort() override { job_.Abort(); }
  absl::Status Failure() override { return job_.Failure(); }
  void Fail(std::string_view reason) override { job_.Fail(reason); }

  absl::Status Close() override {
    PS_RETURN_IF_ERROR(CheckOpen());
    // Every member's exchanges are over once each has come here; the job stays open.
    absl::Status barrier = Gather(JobChannel('c', "close"), "", "(close)").status();
    closed_.store(true, std::memory_order_release);
    return barrier;
  }

 private:
  absl::Status CheckOpen() const {
    if (!closed_.load(std::memory_order_acquire)) return absl::OkStatus();
    return absl::InvalidArgumentError(
        absl::StrCat("the group '", name_, "' of the job's processes is closed"));
  }

  // The job's channel for the group's `channel` of `kind` ('g' AllGather, 'p' point to
  // point, 'c' Close): "<name>_<kind><channel>", or, when that is longer than a channel
  // may be, "<name>_<KIND><hash of channel>". A group name has no '_', so two groups'
  // channels never meet.
  std::string JobChannel(char kind, std::string_view channel) const {
    std::string out = absl::StrCat(name_, "_", std::string(1, kind), Absl(channel));
    if (out.size() <= 64) return out;
    Fnv1a64 hash;
    hash.Add(channel);
    return absl::StrCat(name_, "_", std::string(1, static_cast<char>(kind - 'a' + 'A')),
                        absl::Hex(hash.value(), absl::kZeroPad16));
  }

  // A timeout names the job's channel ("<name>_g<channel>"): say which group's and which
  // of its channels that is.
  absl::Status InGroup(const absl::Status& status, std::string_view channel) const {
    if (!absl::IsDeadlineExceeded(status)) return status;
    return absl::DeadlineExceededError(absl::StrCat("in the group '", name_, "' of processes [",
                                                    absl::StrJoin(members_, ", "), "], channel '",
                                                    Absl(channel), "': ", status.message()));
  }

  absl::StatusOr<std::vector<std::string>> Gather(const std::string& channel,
                                                  std::string_view bytes,
                                                  std::string_view group_channel) {
    // Each part starts with the group's id: a member given other members or another
    // name is found at its first exchange, not as a wait that never ends.
    const std::string part = absl::StrCat(id_, Absl(bytes));
    const int n = size();
    for (int q = 0; q < n; ++q) {
      if (q != rank_) PS_RETURN_IF_ERROR(job_.Send(members_[q], channel, part));
    }
    std::vector<std::string> all(n);
    for (int q = 0; q < n; ++q) {
      if (q == rank_) {
        all[q] = std::string(bytes);
        continue;
      }
      absl::StatusOr<std::string> received = job_.Receive(members_[q], channel);
      if (!received.ok()) return InGroup(received.status(), group_channel);
      std::string theirs = *std::move(received);
      if (!theirs.starts_with(id_)) {
        return absl::FailedPreconditionError(
            absl::StrCat("process ", job_.job_rank(members_[q]), " is not in the same group '",
                         name_, "' of processes [", absl::StrJoin(members_, ", "),
                         "] as this one: every member of a group needs the same name and members"));
      }
      all[q] = theirs.substr(id_.size());
    }
    return all;
  }

  Bootstrap& job_;
  const std::vector<int> members_;
  const std::string name_;
  const int rank_;
  std::string id_;  // the hash of the name and members, 8 bytes
  std::atomic<bool> closed_{false};
};

}  // namespace

absl::StatusOr<std::unique_ptr<Bootstrap>> CreateGroupBootstrap(Bootstrap& job,
                                                                std::vector<int> members,
                                                                std::string_view name) {
  if (!IsGroupName(name)) {
    return absl::InvalidArgumentError(absl::StrCat("group name ", QuoteForMessage(name),
                                                   " is not 1 to ", kMaxGroupName,
                                                   " letters and digits"));
  }
  if (members.empty()) {
    return absl::InvalidArgumentError("a group of processes needs at least one member");
  }
  std::vector<int> sorted = members;
  std::sort(sorted.begin(), sorted.end());
  for (std::size_t i = 0; i < sorted.size(); ++i) {
    if (sorted[i] < 0 || sorted[i] >= job.size()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "group member ", sorted[i], " is not a process of the job: use 0 to ", job.size() - 1));
    }
    if (i > 0 && sorted[i] == sorted[i - 1]) {
      return absl::InvalidArgumentError(
          absl::StrCat("process ", sorted[i], " is a member of the group twice"));
    }
  }
  const auto self = std::find(members.begin(), members.end(), job.rank());
  if (self == members.end()) {
    return absl::InvalidArgumentError(absl::StrCat("this process (rank ", job.rank(),
                                                   " of the job) is not a member of the group [",
                                                   absl::StrJoin(members, ", "), "]"));
  }
  const int rank = static_cast<int>(self - members.begin());
  return std::unique_ptr<Bootstrap>(
      new GroupBootstrap(job, std::move(members), std::string(name), rank));
}

absl::Status AgreeOnVerdict(const std::vector<Bootstrap*>& groups, std::string_view channel,
                            absl::Status own) {
  struct Verdict {
    std::int64_t job_rank = -1;  // of the process that failed; -1: every one passed
    std::int64_t code = 0;
    std::string message;
  };
  Verdict verdict;
  std::int64_t self = -1;
  for (Bootstrap* group : groups) {
    if (group == nullptr || group->size() < 2) continue;
    if (self < 0) {
      self = group->job_rank(group->rank());
      if (!own.ok()) {
        verdict = {.job_rank = self,
                   .code = static_cast<std::int64_t>(own.code()),
                   .message = std::string(own.message())};
      }
    }
    ByteWriter out;
    out.Int(verdict.job_rank);
    out.Int(verdict.code);
    out.Text(verdict.message);
    PS_ASSIGN_OR_RETURN(const std::vector<std::string> all, group->AllGather(channel, out.bytes()));
    verdict = {};
    for (std::size_t q = 0; q < all.size() && verdict.job_rank < 0; ++q) {
      ByteReader in(all[q]);
      Verdict theirs{.job_rank = in.Int(), .code = in.Int(), .message = in.Text()};
      // A verdict that names no code, or OK, is not one any process sends.
      if (!in.ok() || theirs.code < 0 || theirs.code > 16 ||
          (theirs.job_rank >= 0 && theirs.code == 0)) {
        return absl::InternalError(absl::StrCat("process ", group->job_rank(static_cast<int>(q)),
                                                " sent a verdict this process cannot read"));
      }
      if (theirs.job_rank >= 0) verdict = std::move(theirs);
    }
  }
  if (self < 0) return own;
  if (verdict.job_rank < 0) return absl::OkStatus();
  absl::Status agreed(static_cast<absl::StatusCode>(verdict.code),
                      verdict.job_rank == self
                          ? verdict.message
                          : absl::StrCat("process ", verdict.job_rank, ": ", verdict.message));
  agreed.SetPayload(kHeardByAllUrl, absl::Cord("1"));
  return agreed;
}

bool HeardByAll(const absl::Status& status) {
  return !status.ok() && status.GetPayload(kHeardByAllUrl).has_value();
}

absl::StatusOr<JobGrid> SplitJob(Bootstrap& job, int pipeline_processes) {
  const int n = job.size(), k = pipeline_processes;
  if (k < 1 || n % k != 0) {
    return absl::InvalidArgumentError(absl::StrCat("a job of ", n,
                                                   " processes cannot be split into pipelines of ",
                                                   k, " processes: give a divisor of ", n));
  }
  const int groups = n / k;  // whole pipelines
  const int q = job.rank();
  const int position = q / groups, replica = q % groups;
  std::vector<int> pipeline, replicas;
  for (int i = 0; i < k; ++i) pipeline.push_back(i * groups + replica);
  for (int g = 0; g < groups; ++g) replicas.push_back(position * groups + g);
  JobGrid grid;
  // K in the names too: the grids of two K on one job never share a channel.
  PS_ASSIGN_OR_RETURN(grid.pipeline, CreateGroupBootstrap(job, std::move(pipeline),
                                                          absl::StrCat("pipe", k, "x", replica)));
  PS_ASSIGN_OR_RETURN(grid.replicas, CreateGroupBootstrap(job, std::move(replicas),
                                                          absl::StrCat("repl", k, "x", position)));
  return grid;
}

}  // namespace pipesched::comm
