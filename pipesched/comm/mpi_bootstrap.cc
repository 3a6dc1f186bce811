// The MPI bootstrap (comm/bootstrap.h, CreateMpiBootstrap); without MPI
// (PIPESCHED_HAS_MPI unset) only the factory's refusal.
//
// One thread of each bootstrap makes its MPI calls after creation, on a duplicate of
// MPI_COMM_WORLD (so they never meet the embedder's), with one tag. Messages:
//   'D' <channel size: 1 byte> <channel> <exchange k: 8 bytes, little-endian> <bytes>
//        the sender's part of its k-th exchange on that channel
//   'P' <channel size: 1 byte> <channel> <message k: 8 bytes, little-endian> <bytes>
//        the sender's k-th Send to this rank on that channel (sent to that rank only)
//   'F' <reason>
//        the sender failed (Fail): every exchange of the job ends with its reason
//   'H'  the sender's heartbeat, sent to every rank each second by its thread while
//        BootstrapOptions::heartbeat_timeout_seconds is above 0
// Any message from a rank is a sign of life; a rank missing from an exchange (or the
// sender a Receive waits for) that has not given one for the heartbeat timeout (by this
// rank's clock, while its thread ran) ends the wait with Aborted "process <r> has shown
// no sign of life ...". That finds a process that is stopped (SIGSTOP, a debugger) or
// whose host is cut off, which the MPI launcher does not: it ends the job only when a
// process exits.
// A caller of an exchange files its own part and queues one message per other rank (one
// payload shared by all), then waits under the mutex for the other parts; a Send queues
// one message and returns, a Receive waits for its message. The thread sends the queue
// (MPI_Isend, each payload kept until its send completes), probes for what arrived
// (MPI_Iprobe, then MPI_Recv of its size) and files each part under (channel, k,
// sender), each point-to-point message under (sender, channel, k) until a Receive takes
// it; with nothing to do it waits on a condition variable that a new message in the
// queue signals, for up to 20 us while a caller waits (an exchange or a Receive) and up
// to 1 ms otherwise.
#include "pipesched/comm/bootstrap.h"

#ifdef PIPESCHED_HAS_MPI
#include <mpi.h>
#include <sys/prctl.h>
#endif

#include <algorithm>
#include <atomic>
#include <chrono>
#include <climits>
#include <condition_variable>
#include <cstdint>
#include <cstdlib>
#include <deque>
#include <list>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <thread>
#include <tuple>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "pipesched/base/status.h"
#include "pipesched/base/strings.h"
#include "pipesched/comm/internal.h"

namespace pipesched::comm {

#ifndef PIPESCHED_HAS_MPI

bool MpiBootstrapBuilt() { return false; }

absl::StatusOr<std::unique_ptr<Bootstrap>> CreateMpiBootstrap(const BootstrapOptions&) {
  return absl::FailedPreconditionError(
      "this pipesched was built without MPI (CMake found none: on Debian install "
      "libopenmpi-dev and openmpi-bin, then configure again): start the processes with "
      "`pipesched launch`, or give each --processes, --process-rank and --rendezvous");
}

#else

namespace {

using Clock = std::chrono::steady_clock;

constexpr int kTag = 0x7073;  // "ps"

std::string MpiErrorText(int code) {
  char text[MPI_MAX_ERROR_STRING];
  int size = 0;
  if (MPI_Error_string(code, text, &size) != MPI_SUCCESS) return absl::StrCat("MPI error ", code);
  return std::string(text, static_cast<std::size_t>(size));
}

absl::Status MpiFailed(std::string_view call, int code) {
  return absl::InternalError(
      absl::StrCat("MPI bootstrap: ", Absl(call), " failed: ", MpiErrorText(code)));
}

class MpiBootstrap;

// The bootstraps alive in this process, whose threads FinalizeAtExit stops first (one
// that outlives main, a static say, would otherwise call MPI after MPI_Finalize). Never
// destroyed: atexit functions may run after static destructors.
struct Live {
  std::mutex mu;
  std::set<MpiBootstrap*> bootstraps;
};
Live& LiveBootstraps() {
  static Live* live = new Live;
  return *live;
}

void FinalizeAtExit();

// Set once a bootstrap of this process has seen its job fail (Fail, a failure received,
// an MPI error, Abort, a timeout): another process may then never come to MPI_Finalize,
// which waits for every process, so FinalizeAtExit waits for it only so long.
std::atomic<bool> g_job_failed{false};
constexpr auto kFinalizeWaitAfterFailure = std::chrono::seconds(10);

// MPI initialized with MPI_THREAD_MULTIPLE (here, unless the embedder did).
absl::Status InitializeMpi() {
  static std::mutex mu;
  std::lock_guard<std::mutex> lock(mu);
  int finalized = 0;
  if (const int rc = MPI_Finalized(&finalized); rc != MPI_SUCCESS) {
    return MpiFailed("MPI_Finalized", rc);
  }
  if (finalized) {
    return absl::FailedPreconditionError(
        "MPI bootstrap: MPI was finalized already, and cannot be initialized again: create "
        "the bootstrap before MPI_Finalize");
  }
  int initialized = 0;
  if (const int rc = MPI_Initialized(&initialized); rc != MPI_SUCCESS) {
    return MpiFailed("MPI_Initialized", rc);
  }
  int provided = 0;
  if (!initialized) {
    if (const int rc = MPI_Init_thread(nullptr, nullptr, MPI_THREAD_MULTIPLE, &provided);
        rc != MPI_SUCCESS) {
      return MpiFailed("MPI_Init_thread", rc);
    }
    std::atexit(FinalizeAtExit);
  } else if (const int rc = MPI_Query_thread(&provided); rc != MPI_SUCCESS) {
    return MpiFailed("MPI_Query_thread", rc);
  }
  if (provided < MPI_THREAD_MULTIPLE) {
    return absl::FailedPreconditionError(absl::StrCat(
        "MPI bootstrap: MPI gives thread level ", provided, ", and the bootstrap needs ",
        MPI_THREAD_MULTIPLE, " (MPI_THREAD_MULTIPLE: its own thread calls MPI): ",
        initialized ? "initialize MPI with MPI_Init_thread(..., MPI_THREAD_MULTIPLE, ...)"
                    : "use an MPI library built with thread support (Debian's Open MPI is)"));
  }
  return absl::OkStatus();
}

void PutUint64(std::string& out, std::uint64_t v) {
  for (int i = 0; i < 8; ++i) out.push_back(static_cast<char>((v >> (8 * i)) & 0xff));
}

std::uint64_t GetUint64(std::string_view in) {
  std::uint64_t v = 0;
  for (int i = 7; i >= 0; --i) v = (v << 8) | static_cast<unsigned char>(in[i]);
  return v;
}

// The bytes of one exchange's part or one Send: MPI counts in int, so a message is at
// most INT_MAX bytes, its header (type, channel size, at most 64 characters, k) included.
constexpr std::size_t kMostBytes = static_cast<std::size_t>(INT_MAX) - 2 - 64 - 8;

// OK, or InvalidArgument for `size` bytes on `channel` over kMostBytes (`carrier`: "exchange",
// "message"), which the caller refuses before anything is numbered or sent.
absl::Status CheckSize(std::string_view channel, std::size_t size, std::string_view carrier) {
  if (size <= kMostBytes) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat(
      "MPI bootstrap: ", size, " bytes on channel '", Absl(channel), "' are more than one ",
      Absl(carrier), " carries (", kMostBytes, ", MPI's int count): give them in parts"));
}

// A numbered message ('D' or 'P', see the head of this file).
std::string NumberedMessage(char type, std::string_view channel, std::int64_t k,
                            std::string_view bytes) {
  std::string message(1, type);
  message.reserve(2 + channel.size() + 8 + bytes.size());  // one allocation, bytes may be large
  message.push_back(static_cast<char>(channel.size()));
  message.append(channel);
  PutUint64(message, static_cast<std::uint64_t>(k));
  message.append(bytes);
  return message;
}

class MpiBootstrap final : public Bootstrap {
 public:
  MpiBootstrap(MPI_Comm comm, int rank, int size, BootstrapOptions options)
      : comm_(comm),
        rank_(rank),
        size_(size),
        options_(options),
        last_heard_(static_cast<std::size_t>(size), Clock::now()) {
    thread_ = std::thread([this] { Run(); });
    std::lock_guard<std::mutex> lock(LiveBootstraps().mu);
    LiveBootstraps().bootstraps.insert(this);
  }
  ~MpiBootstrap() override {
    {
      std::lock_guard<std::mutex> lock(LiveBootstraps().mu);
      LiveBootstraps().bootstraps.erase(this);
    }
    StopThread(/*drain_seconds=*/1);
    // The duplicate communicator is freed by Close() (MPI_Comm_free is collective: a
    // bootstrap that did not close cannot count on the others), else by MPI_Finalize.
  }
  MpiBootstrap(const MpiBootstrap&) = delete;
  MpiBootstrap& operator=(const MpiBootstrap&) = delete;

  std::string_view kind() const override { return "mpi"; }
  int rank() const override { return rank_; }
  int size() const override { return size_; }

  // Stops the thread once it has sent what is queued, or after `drain_seconds`.
  // Idempotent; not concurrent with itself.
  void StopThread(double drain_seconds) {
    std::lock_guard<std::mutex> stop_lock(stop_mu_);
    if (!thread_.joinable()) return;
    {
      std::lock_guard<std::mutex> lock(mu_);
      stopping_ = true;
      stop_drain_until_ = internal::DeadlineAfter(drain_seconds).value_or(Clock::time_point::max());
    }
    thread_cv_.notify_one();
    thread_.join();
  }

  absl::StatusOr<std::vector<std::string>> AllGather(std::string_view channel,
                                                     std::string_view bytes) override {
    PS_RETURN_IF_ERROR(internal::CheckChannel(channel));
    return Exchange(channel, bytes);
  }

  absl::Status Send(int to, std::string_view channel, std::string_view bytes) override {
    PS_RETURN_IF_ERROR(CheckPointToPoint(to, channel));
    PS_RETURN_IF_ERROR(CheckSize(channel, bytes.size(), "message"));
    const std::pair<int, std::string> pair(to, std::string(channel));
    std::unique_lock<std::mutex> lock(mu_);
    // Counted once queued (a refused Send leaves the numbering as it was); calls on one
    // (peer, channel) do not overlap, so nothing takes this number meanwhile.
    const std::int64_t k = sent_next_[pair];
    // The message is made without the lock: it may be large.
    lock.unlock();
    auto payload = std::make_shared<const std::string>(NumberedMessage('P', channel, k, bytes));
    lock.lock();
    // Nothing may follow this rank's close part (see Exchange), even a Send that raced
    // Close() on another thread.
    if (sent_close_) return AfterClose("Send or Receive");
    PS_RETURN_IF_ERROR(Interrupted(MessageWhere(channel, k)));
    ++sent_next_[pair];
    outbox_.push_back({to, std::move(payload)});
    lock.unlock();
    thread_cv_.notify_one();
    return absl::OkStatus();
  }

  absl::StatusOr<std::string> Receive(int from, std::string_view channel) override {
    PS_RETURN_IF_ERROR(CheckPointToPoint(from, channel));
    const std::optional<Clock::time_point> deadline =
        internal::DeadlineAfter(options_.timeout_seconds);
    const std::pair<int, std::string> pair(from, std::string(channel));
    std::unique_lock<std::mutex> lock(mu_);
    // Counted once received, so a Receive that timed out may be asked again for the same
    // message.
    const std::int64_t k = received_next_[pair];
    const std::string where = MessageWhere(channel, k);
    PS_RETURN_IF_ERROR(Interrupted(where));
    const auto key = std::make_tuple(from, pair.second, k);
    PS_RETURN_IF_ERROR(Wait(
        lock, deadline, where, [&] { return arrived_.count(key) > 0; },
        [&] {
          // Only `from` is waited for.
          std::vector<bool> present(static_cast<std::size_t>(size_), true);
          present[from] = false;
          return present;
        },
        [&] {
          return absl::StrCat("a message from rank ", from, " (stopped, or not sending it?)");
        }));
    auto it = arrived_.find(key);
    std::string message = std::move(it->second);
    arrived_.erase(it);
    ++received_next_[pair];
    return message;
  }

  void Abort() override {
    g_job_failed = true;
    {
      std::lock_guard<std::mutex> lock(mu_);
      aborted_ = true;
    }
    cv_.notify_all();
  }

  absl::Status Failure() override {
    std::lock_guard<std::mutex> lock(mu_);
    if (failure_.has_value()) return absl::AbortedError(*failure_);
    // Once this rank's close part is out, the others may stop beating because they have
    // left: none is judged outside an exchange (one missing from the close exchange is).
    if (!sent_close_) {
      std::vector<bool> everyone(static_cast<std::size_t>(size_), false);
      if (absl::Status silent = JudgeSilence(everyone); !silent.ok()) {
        // Latched, as an exchange's verdict is: the job has failed.
        failure_ = std::string(silent.message());
        g_job_failed = true;
        cv_.notify_all();
        return silent;
      }
    }
    return error_;
  }

  void Fail(std::string_view reason) override {
    g_job_failed = true;
    {
      std::lock_guard<std::mutex> lock(mu_);
      // Told once; not after this rank's close part (see Exchange) or once stopping.
      if (told_others_ || sent_close_ || stopping_) return;
      told_others_ = true;
      if (!failure_.has_value()) {
        failure_ = absl::StrCat("process ", rank_, " failed: ", internal::FailureReason(reason));
      }
      auto payload =
          std::make_shared<std::string>(absl::StrCat("F", internal::FailureReason(reason)));
      for (int r = 0; r < size_; ++r) {
        if (r != rank_) outbox_.push_back({r, payload});
      }
    }
    cv_.notify_all();
    thread_cv_.notify_one();
  }

  absl::Status Close() override {
    if (closed_) return absl::OkStatus();
    PS_RETURN_IF_ERROR(Exchange(internal::kCloseChannel, "").status());
    closed_ = true;
    // Every rank's part of every exchange has arrived, so what is left to send is at
    // most the close exchange's parts, which the others are waiting for.
    StopThread(options_.timeout_seconds > 0 ? options_.timeout_seconds : 1e9);
    if (const int rc = MPI_Comm_free(&comm_); rc != MPI_SUCCESS) {
      return MpiFailed("MPI_Comm_free", rc);
    }
    return absl::OkStatus();
  }

 private:
  struct Outgoing {
    int to;
    std::shared_ptr<const std::string> payload;
  };
  struct Sending {
    std::shared_ptr<const std::string> payload;
    MPI_Request request;
  };
  struct Receiving {
    int from;
    std::unique_ptr<std::string> message;  // where MPI writes: must not move
    MPI_Request request;
  };
  struct Round {
    explicit Round(int size) : slots(size) {}
    std::vector<std::optional<std::string>> slots;
    int arrived = 0;
  };

  absl::StatusOr<std::vector<std::string>> Exchange(std::string_view channel,
                                                    std::string_view bytes) {
    if (closed_) return AfterClose("AllGather");
    PS_RETURN_IF_ERROR(CheckSize(channel, bytes.size(), "exchange"));
    const std::optional<Clock::time_point> deadline =
        internal::DeadlineAfter(options_.timeout_seconds);
    std::unique_lock<std::mutex> lock(mu_);
    const std::int64_t k = next_[std::string(channel)]++;
    // The message is made without the lock: a part may be large.
    std::shared_ptr<const std::string> payload;
    if (size_ > 1) {
      lock.unlock();
      payload = std::make_shared<const std::string>(NumberedMessage('D', channel, k, bytes));
      lock.lock();
    }
    const std::string where = absl::StrCat("channel '", Absl(channel), "' (exchange ", k, ")");
    PS_RETURN_IF_ERROR(Interrupted(where));
    const auto key = std::make_pair(std::string(channel), k);
    Round& round = rounds_.try_emplace(key, size_).first->second;
    round.slots[rank_] = std::string(bytes);
    ++round.arrived;
    if (payload != nullptr) {
      for (int r = 0; r < size_; ++r) {
        if (r != rank_) outbox_.push_back({r, payload});
      }
    }
    // This rank's close part is the last message it sends on the communicator (MPI keeps
    // a pair's messages in order): a peer that has it may free the communicator, whose
    // context a later one reuses, where anything sent after it would be taken for that
    // communicator's.
    if (channel == internal::kCloseChannel) sent_close_ = true;
    PS_RETURN_IF_ERROR(Wait(
        lock, deadline, where, [&] { return round.arrived == size_; },
        [&] { return Present(round); },
        [&] {
          return absl::StrCat(internal::MissingRanks(Present(round)),
                              " (stopped, or not making this exchange?)");
        }));
    std::vector<std::string> out;
    out.reserve(size_);
    for (std::optional<std::string>& slot : round.slots) out.push_back(std::move(*slot));
    rounds_.erase(key);
    return out;
  }

  // What an exchange and a Receive share: waits, with `lock` (on mu_) held, until
  // `arrived()`, looking every 0.25 s at the silence of the ranks that `present()` (by
  // rank) says are not there. OK once arrived; else Aborted (a rank failed, or was judged
  // silent here: latched), the thread's error, DeadlineExceeded "... waited T s on
  // <where> for <missing()>", or Cancelled (Abort()).
  template <typename ArrivedFn, typename PresentFn, typename MissingFn>
  absl::Status Wait(std::unique_lock<std::mutex>& lock, std::optional<Clock::time_point> deadline,
                    std::string_view where, ArrivedFn arrived, PresentFn present,
                    MissingFn missing) {
    auto ready = [&] { return arrived() || aborted_ || failure_.has_value() || !error_.ok(); };
    bool in_time = true;
    ++waiting_;
    thread_cv_.notify_one();  // to poll closely from now on
    while (!ready()) {
      // Every 0.25 s a look at the silence of the ranks still missing.
      Clock::time_point until = Clock::now() + std::chrono::milliseconds(250);
      if (deadline.has_value()) until = std::min(until, *deadline);
      if (cv_.wait_until(lock, until, ready)) break;
      if (deadline.has_value() && Clock::now() >= *deadline) {
        in_time = false;
        break;
      }
      if (absl::Status silent = JudgeSilence(present()); !silent.ok()) {
        failure_ = std::string(silent.message());
        g_job_failed = true;
        cv_.notify_all();
        break;
      }
    }
    --waiting_;
    if (arrived()) return absl::OkStatus();
    if (failure_.has_value()) return absl::AbortedError(*failure_);
    PS_RETURN_IF_ERROR(error_);
    if (!in_time) {
      g_job_failed = true;
      return absl::DeadlineExceededError(absl::StrCat("MPI bootstrap: rank ", rank_, " waited ",
                                                      options_.timeout_seconds, " s on ",
                                                      Absl(where), " for ", missing()));
    }
    return Cancelled(where);
  }

  // Before a call numbers and queues anything (with the mutex held): Cancelled once
  // Abort() was called, Aborted once the job failed, or the thread's error.
  absl::Status Interrupted(std::string_view where) const {
    if (aborted_) return Cancelled(where);
    if (failure_.has_value()) return absl::AbortedError(*failure_);
    return error_;
  }

  absl::Status Cancelled(std::string_view where) const {
    return absl::CancelledError(
        absl::StrCat("bootstrap rank ", rank_, ": aborted on ", Absl(where)));
  }

  absl::Status AfterClose(std::string_view call) const {
    return absl::InvalidArgumentError(
        absl::StrCat("bootstrap rank ", rank_, ": ", Absl(call), " after Close()"));
  }

  static std::string MessageWhere(std::string_view channel, std::int64_t k) {
    return absl::StrCat("channel '", Absl(channel), "' (message ", k, ")");
  }

  // Send's and Receive's arguments, as the other kinds check them: InvalidArgument for
  // a channel AllGather refuses, a peer that is not another rank of the job, or a call
  // after Close().
  absl::Status CheckPointToPoint(int peer, std::string_view channel) const {
    PS_RETURN_IF_ERROR(internal::CheckChannel(channel));
    PS_RETURN_IF_ERROR(internal::CheckPeer(peer, rank_, size_));
    if (closed_) return AfterClose("Send or Receive");
    return absl::OkStatus();
  }

  // Which ranks' parts of `round` are there.
  static std::vector<bool> Present(const Round& round) {
    std::vector<bool> present;
    for (const std::optional<std::string>& slot : round.slots) present.push_back(slot.has_value());
    return present;
  }

  // OK, or Aborted naming the first rank not `present` that has given no sign of life
  // for the heartbeat timeout (with the mutex held).
  absl::Status JudgeSilence(const std::vector<bool>& present) const {
    const double timeout = options_.heartbeat_timeout_seconds;
    if (!(timeout > 0) || timeout > 1e9) return absl::OkStatus();
    const Clock::time_point now = Clock::now();
    // The thread has not run for a while (this process was stopped): it has not yet
    // heard what the others sent meanwhile, nor reset their times.
    if (now - last_turn_ > std::chrono::seconds(1)) return absl::OkStatus();
    for (int r = 0; r < size_; ++r) {
      if (r == rank_ || present[r]) continue;
      const double silent = std::chrono::duration<double>(now - last_heard_[r]).count();
      if (silent > timeout) {
        return absl::AbortedError(absl::StrFormat(
            "process %d has shown no sign of life for %.1f s (no MPI message from it, its "
            "heartbeat included: is it stopped, or its host down or cut off?)",
            r, silent));
      }
    }
    return absl::OkStatus();
  }

  // Files a message from `from` (the thread, without the mutex held).
  void Deliver(int from, std::string message) {
    std::lock_guard<std::mutex> lock(mu_);
    last_heard_[from] = Clock::now();
    const std::string_view m = message;
    if (m == "H") return;
    if (!m.empty() && m[0] == 'F') {
      if (!failure_.has_value()) {
        failure_ = absl::StrCat("process ", from, " failed: ", Absl(m.substr(1)));
      }
      g_job_failed = true;
      cv_.notify_all();
      return;
    }
    const std::size_t channel_size = m.size() >= 2 ? static_cast<unsigned char>(m[1]) : 0;
    if (m.empty() || (m[0] != 'D' && m[0] != 'P') || m.size() < 2 + channel_size + 8) {
      SetError(absl::InternalError(absl::StrCat(
          "MPI bootstrap: rank ", rank_, " got a message of ", m.size(), " bytes from rank ", from,
          " that is no bootstrap message (is another program using its communicator?)")));
      return;
    }
    const std::string channel(m.substr(2, channel_size));
    const auto k = static_cast<std::int64_t>(GetUint64(m.substr(2 + channel_size, 8)));
    if (m[0] == 'P') {
      auto [it, filed] = arrived_.try_emplace(std::make_tuple(from, channel, k));
      if (!filed) {
        SetError(absl::InternalError(absl::StrCat("MPI bootstrap: rank ", rank_, " got rank ", from,
                                                  "'s message ", k, " on channel '", channel,
                                                  "' twice")));
        return;
      }
      // In place: a message may be large.
      message.erase(0, 2 + channel_size + 8);
      it->second = std::move(message);
      cv_.notify_all();
      return;
    }
    Round& round = rounds_.try_emplace(std::make_pair(channel, k), size_).first->second;
    if (round.slots[from].has_value()) {
      SetError(absl::InternalError(absl::StrCat("MPI bootstrap: rank ", rank_, " got rank ", from,
                                                "'s part of exchange ", k, " on channel '", channel,
                                                "' twice")));
      return;
    }
    round.slots[from] = std::string(m.substr(2 + channel_size + 8));
    if (++round.arrived == size_) cv_.notify_all();
  }

  // The first error of the thread ends every exchange (with the mutex held).
  void SetError(absl::Status status) {
    g_job_failed = true;
    if (error_.ok()) error_ = std::move(status);
    cv_.notify_all();
  }

  void Run() {
    // Sleeps of microseconds as asked, not stretched by the default 50 us timer slack
    // (an exchange's latency is mostly this thread's polling).
    (void)::prctl(PR_SET_TIMERSLACK, 1000UL, 0UL, 0UL, 0UL);
    std::vector<Sending> sending;
    std::list<Receiving> receiving;
    std::chrono::microseconds idle(0);
    Clock::time_point last_traffic = Clock::now();
    std::optional<Clock::time_point> drain_until;
    const bool beating = size_ > 1 && options_.heartbeat_timeout_seconds > 0;
    const auto beat = std::make_shared<const std::string>("H");
    Clock::time_point next_beat = Clock::now();
    while (true) {
      std::deque<Outgoing> out;
      {
        std::unique_lock<std::mutex> lock(mu_);
        const Clock::time_point now = Clock::now();
        // This process was stopped (or starved) for a while: what it did not hear then
        // says nothing of the others.
        if (now - last_turn_ > std::chrono::seconds(1)) {
          std::fill(last_heard_.begin(), last_heard_.end(), now);
        }
        last_turn_ = now;
        if (beating && !stopping_ && !sent_close_ && now >= next_beat) {
          for (int r = 0; r < size_; ++r) {
            if (r != rank_) outbox_.push_back({r, beat});
          }
          next_beat = now + std::chrono::seconds(1);
        }
        if (stopping_) {
          if (!drain_until.has_value()) drain_until = stop_drain_until_;
          if ((outbox_.empty() && sending.empty()) || Clock::now() >= *drain_until) break;
        }
        out.swap(outbox_);
      }
      bool busy = !out.empty();
      for (Outgoing& o : out) {
        Sending s{std::move(o.payload), MPI_REQUEST_NULL};
        if (const int rc = MPI_Isend(s.payload->data(), static_cast<int>(s.payload->size()),
                                     MPI_BYTE, o.to, kTag, comm_, &s.request);
            rc != MPI_SUCCESS) {
          std::lock_guard<std::mutex> lock(mu_);
          SetError(MpiFailed("MPI_Isend", rc));
          continue;
        }
        sending.push_back(std::move(s));
      }
      for (auto it = sending.begin(); it != sending.end();) {
        int done = 0;
        if (const int rc = MPI_Test(&it->request, &done, MPI_STATUS_IGNORE); rc != MPI_SUCCESS) {
          std::lock_guard<std::mutex> lock(mu_);
          SetError(MpiFailed("MPI_Test", rc));
          done = 1;
        }
        if (done) {
          it = sending.erase(it);
          busy = true;
        } else {
          ++it;
        }
      }
      // Receives never block the thread (a sender stopped halfway through a large part
      // must not stop its heartbeat, sends and verdicts): each message found is matched
      // (MPI_Improbe) and received in the background (MPI_Imrecv), then filed once its
      // request completes.
      for (int n = 0; n < 64; ++n) {
        int arrived = 0;
        MPI_Message matched = MPI_MESSAGE_NULL;
        MPI_Status status;
        if (const int rc = MPI_Improbe(MPI_ANY_SOURCE, kTag, comm_, &arrived, &matched, &status);
            rc != MPI_SUCCESS) {
          std::lock_guard<std::mutex> lock(mu_);
          SetError(MpiFailed("MPI_Improbe", rc));
          break;
        }
        if (!arrived) break;
        int count = 0;
        if (MPI_Get_count(&status, MPI_BYTE, &count) != MPI_SUCCESS || count == MPI_UNDEFINED ||
            count < 0) {
          std::lock_guard<std::mutex> lock(mu_);
          SetError(absl::InternalError(absl::StrCat("MPI bootstrap: a message from rank ",
                                                    status.MPI_SOURCE, " has no byte count")));
          break;
        }
        Receiving in{status.MPI_SOURCE,
                     std::make_unique<std::string>(static_cast<std::size_t>(count), '\0'),
                     MPI_REQUEST_NULL};
        if (const int rc = MPI_Imrecv(in.message->data(), count, MPI_BYTE, &matched, &in.request);
            rc != MPI_SUCCESS) {
          std::lock_guard<std::mutex> lock(mu_);
          SetError(MpiFailed("MPI_Imrecv", rc));
          break;
        }
        receiving.push_back(std::move(in));
        busy = true;
      }
      for (auto it = receiving.begin(); it != receiving.end();) {
        int done = 0;
        if (const int rc = MPI_Test(&it->request, &done, MPI_STATUS_IGNORE); rc != MPI_SUCCESS) {
          std::lock_guard<std::mutex> lock(mu_);
          SetError(MpiFailed("MPI_Test", rc));
          it = receiving.erase(it);
          continue;
        }
        if (done) {
          Deliver(it->from, std::move(*it->message));
          it = receiving.erase(it);
          busy = true;
        } else {
          ++it;
        }
      }
      if (busy) {
        idle = std::chrono::microseconds(0);
        last_traffic = Clock::now();
        continue;
      }
      // Nothing moved: wait a little longer each time, or until a caller queues a
      // message; up to 20 us while a caller waits for the others' parts and something
      // moved in the last 10 ms (their arrival is the exchange's latency), up to 1 ms
      // otherwise (a long wait for a late rank, or only early parts and failures can
      // come: a caller's first message wakes the thread).
      std::unique_lock<std::mutex> lock(mu_);
      const bool close =
          waiting_ > 0 && Clock::now() - last_traffic < std::chrono::milliseconds(10);
      const std::chrono::microseconds most(close ? 20 : 1000);
      idle = std::min(most, idle * 2 + std::chrono::microseconds(1));
      if (close && idle < std::chrono::microseconds(4)) {
        lock.unlock();
        std::this_thread::yield();
        continue;
      }
      thread_cv_.wait_for(lock, idle, [&] { return stopping_ || !outbox_.empty(); });
    }
    // Sends that did not complete in time (their receivers are gone or stuck): their
    // requests are freed and their payloads kept for ever, since MPI may still read them.
    for (Sending& s : sending) {
      MPI_Request_free(&s.request);
      new std::shared_ptr<const std::string>(std::move(s.payload));  // left to MPI
    }
    // Likewise receives still in progress (a sender stopped halfway), their buffers too.
    for (Receiving& in : receiving) {
      MPI_Cancel(&in.request);
      MPI_Request_free(&in.request);
      (void)in.message.release();  // left to MPI
    }
  }

  MPI_Comm comm_;
  const int rank_;
  const int size_;
  const BootstrapOptions options_;
  bool closed_ = false;  // the caller's: Close() and exchanges do not overlap

  std::mutex mu_;
  std::condition_variable cv_;         // a round complete, a failure, an error, Abort()
  std::condition_variable thread_cv_;  // a message queued, or stopping
  std::map<std::string, std::int64_t, std::less<>> next_;
  std::map<std::pair<std::string, std::int64_t>, Round> rounds_;
  // Point to point, by (peer, channel): the number of the next message to send or receive.
  std::map<std::pair<int, std::string>, std::int64_t> sent_next_;
  std::map<std::pair<int, std::string>, std::int64_t> received_next_;
  // Messages not yet received, by (sender, channel, k).
  std::map<std::tuple<int, std::string, std::int64_t>, std::string> arrived_;
  std::deque<Outgoing> outbox_;
  bool aborted_ = false;
  std::optional<std::string> failure_;  // "process <rank> failed: <reason>"
  absl::Status error_;                  // an MPI call of the thread failed
  bool stopping_ = false;
  Clock::time_point stop_drain_until_;
  int waiting_ = 0;           // callers waiting (exchange, Receive): the thread polls closely
  bool sent_close_ = false;   // this rank's close part is queued
  bool told_others_ = false;  // Fail() sent its reason
  std::vector<Clock::time_point> last_heard_;   // by rank: the last message from it
  Clock::time_point last_turn_ = Clock::now();  // the thread's last turn of its loop
  std::mutex stop_mu_;
  std::thread thread_;
};

// MPI_Finalize for an MPI that CreateMpiBootstrap initialized (registered with atexit),
// after stopping the threads of the bootstraps still alive. After a failure it is left
// to a thread of its own and waited for 10 s at most: a process that is stopped or stuck
// never comes to it, and this process then exits without it (its exit status is the
// failure's, and the MPI launcher ends the others).
void FinalizeAtExit() {
  {
    Live& live = LiveBootstraps();
    std::lock_guard<std::mutex> lock(live.mu);
    for (MpiBootstrap* b : live.bootstraps) b->StopThread(/*drain_seconds=*/0.1);
  }
  int finalized = 0;
  if (MPI_Finalized(&finalized) != MPI_SUCCESS || finalized) return;
  if (!g_job_failed) {
    MPI_Finalize();
    return;
  }
  struct Done {
    std::mutex mu;
    std::condition_variable cv;
    bool done = false;
  };
  auto* done = new Done;  // left to the thread, which may outlive this function
  std::thread([done] {
    MPI_Finalize();
    std::lock_guard<std::mutex> lock(done->mu);
    done->done = true;
    done->cv.notify_all();
  }).detach();
  std::unique_lock<std::mutex> lock(done->mu);
  done->cv.wait_for(lock, kFinalizeWaitAfterFailure, [done] { return done->done; });
}

}  // namespace

bool MpiBootstrapBuilt() { return true; }

absl::StatusOr<std::unique_ptr<Bootstrap>> CreateMpiBootstrap(const BootstrapOptions& options) {
  PS_RETURN_IF_ERROR(internal::CheckExchangeTimeout(options.timeout_seconds));
  PS_RETURN_IF_ERROR(internal::CheckHeartbeatTimeout(options.heartbeat_timeout_seconds));
  PS_RETURN_IF_ERROR(InitializeMpi());
  MPI_Comm comm = MPI_COMM_NULL;
  if (const int rc = MPI_Comm_dup(MPI_COMM_WORLD, &comm); rc != MPI_SUCCESS) {
    return MpiFailed("MPI_Comm_dup", rc);
  }
  MPI_Comm_set_errhandler(comm, MPI_ERRORS_RETURN);
  int rank = 0;
  int size = 0;
  MPI_Comm_rank(comm, &rank);
  MPI_Comm_size(comm, &size);
  return std::unique_ptr<Bootstrap>(std::make_unique<MpiBootstrap>(comm, rank, size, options));
}

#endif  // PIPESCHED_HAS_MPI

}  // namespace pipesched::comm
