// The in-process and file bootstraps (comm/bootstrap.h).
//
// File layout in the rendezvous directory:
//   job                     rank 0's "pipesched-bootstrap 1\nsize N\n", written atomically
//                           once the directory exists; the others wait for it
//   <channel>.<k>.<rank>    what `rank` gave to its k-th AllGather on `channel`: written
//                           beside as .tmp.<rank>, then hard-linked into place, so a
//                           reader never sees it half written and a second process with
//                           the same rank fails to link (EEXIST)
//   <channel>.<k>.<from>-<to>
//                           the k-th point-to-point message from `from` to `to` on
//                           `channel` (Send), put in place as exchange files are; the
//                           receiver removes it once read, rank 0's Close() what is left
//   gone.<rank>             written by Close() once `rank` has removed its files
//   alive.<rank>            "<pid> <boot id>\n", flock()ed (exclusive) by `rank` from
//                           joining until Close() has written its gone file: made
//                           beside and locked before it is renamed into place, so a
//                           rank of this host (same boot id) whose file is there but
//                           not locked has ended -- without Close() when it has no gone
//                           file (killed, crashed, exited early). The kernel drops the
//                           lock of a process however it ends. Other hosts' files are
//                           not judged (locks may be per machine on a shared file
//                           system); a file system without flock gets no file: such
//                           ranks are judged by their heartbeat (beat.<rank>)
//   beat.<rank>             "<20-digit count> <pid> <host>\n", rewritten in place every
//                           second by `rank`'s heartbeat thread from the start of its
//                           first exchange until its close exchange is done (made by the
//                           first beat only; opened, written and closed each time, so that
//                           a shared file system's server has it); a rank whose count
//                           another has watched stand still for the heartbeat timeout is
//                           judged gone (host down, process stopped) unless its gone file
//                           is there
//   failed                  "<rank>\n<reason>", written by Fail() of the first rank to
//                           fail (linked into place: one writer wins); every wait checks
//                           for it
// Each rank removes its own file of exchange k-1 once exchange k is complete (everyone
// has then written k, so everyone has finished reading k-1).
//
// Waits look for their files on a schedule (FileBootstrap::Backoff); on Linux a
// point-to-point receive is also woken when its message file (or the failure marker)
// appears in the directory (DirectoryEvents, inotify), so that a message written on this
// host is read as soon as it is linked. A file written from another host over a shared
// file system raises no event here; the schedule finds it.
#include "pipesched/comm/bootstrap.h"

#include <fcntl.h>
#include <poll.h>
#include <sys/eventfd.h>
#include <sys/file.h>
#include <sys/inotify.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <filesystem>
#include <limits>
#include <map>
#include <mutex>
#include <optional>
#include <system_error>
#include <thread>
#include <tuple>
#include <utility>

#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "pipesched/base/file_util.h"
#include "pipesched/base/status.h"
#include "pipesched/base/strings.h"
#include "pipesched/comm/internal.h"

namespace pipesched::comm {
namespace internal {

absl::Status CheckChannel(std::string_view channel) {
  const bool ok = !channel.empty() && channel.size() <= 64 &&
                  std::all_of(channel.begin(), channel.end(), [](char c) {
                    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') ||
                           (c >= '0' && c <= '9') || c == '_' || c == '-';
                  });
  if (ok) return absl::OkStatus();
  return absl::InvalidArgumentError(
      absl::StrCat("bootstrap channel ", QuoteForMessage(channel),
                   " is not 1 to 64 characters of letters, digits, '_' and '-'"));
}

absl::Status CheckRankAndSize(int rank, int size) {
  if (size < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("a bootstrap needs at least 1 process, not ", size));
  }
  if (rank < 0 || rank >= size) {
    return absl::InvalidArgumentError(absl::StrCat("rank ", rank, " is out of range for ", size,
                                                   " processes: use 0 to ", size - 1));
  }
  return absl::OkStatus();
}

absl::Status CheckPeer(int peer, int rank, int size) {
  if (peer == rank) {
    return absl::InvalidArgumentError(absl::StrCat(
        "bootstrap rank ", rank, " cannot send to or receive from itself: give another rank"));
  }
  if (peer < 0 || peer >= size) {
    return absl::InvalidArgumentError(absl::StrCat("peer rank ", peer, " is out of range for ",
                                                   size, " processes: use 0 to ", size - 1));
  }
  return absl::OkStatus();
}

std::string MissingRanks(const std::vector<bool>& present) {
  std::vector<int> missing;
  for (int r = 0; r < static_cast<int>(present.size()); ++r) {
    if (!present[r]) missing.push_back(r);
  }
  return absl::StrCat(missing.size() == 1 ? "rank " : "ranks ", absl::StrJoin(missing, ", "));
}

std::optional<std::chrono::steady_clock::time_point> DeadlineAfter(double seconds) {
  // Past 30 years a deadline is none (and the duration would overflow the clock).
  if (!(seconds > 0) || seconds > 1e9) return std::nullopt;
  using Clock = std::chrono::steady_clock;
  return Clock::now() +
         std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(seconds));
}

absl::Status CheckExchangeTimeout(double seconds) {
  if (seconds >= 0) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat(
      "the bootstrap's exchange timeout must be >= 0 seconds (0 = until aborted), not ", seconds));
}

absl::Status CheckHeartbeatTimeout(double seconds) {
  if (!std::isfinite(seconds) || seconds < 0 || (seconds > 0 && seconds < 2)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "the heartbeat timeout must be 0 (not judged) or at least 2 seconds, not ", seconds));
  }
  return absl::OkStatus();
}

std::string FailureReason(std::string_view reason) {
  std::string line(reason.substr(0, std::min<std::size_t>(reason.size(), 1000)));
  std::replace(line.begin(), line.end(), '\n', ' ');
  return line;
}

}  // namespace internal

namespace {

using Clock = std::chrono::steady_clock;
using internal::CheckChannel;
using internal::CheckRankAndSize;
using internal::DeadlineAfter;
using internal::kCloseChannel;
using internal::MissingRanks;

// ---------------------------------------------------------------------------------------
// In-process

struct Round {
  explicit Round(int size) : slots(size) {}
  std::vector<std::optional<std::string>> slots;
  int arrived = 0;
  int taken = 0;
};

struct Group {
  explicit Group(int size, BootstrapOptions options) : size(size), options(options) {}
  const int size;
  const BootstrapOptions options;
  std::mutex mu;
  std::condition_variable cv;
  std::map<std::pair<std::string, std::int64_t>, Round> rounds;
  // Point-to-point messages sent and not yet received, by (from, to, channel), in order.
  std::map<std::tuple<int, int, std::string>, std::deque<std::string>> mail;
  std::optional<std::string> failure;  // Fail(): "process <rank> failed: <reason>"
};

class InProcessBootstrap final : public Bootstrap {
 public:
  InProcessBootstrap(std::shared_ptr<Group> group, int rank)
      : group_(std::move(group)), rank_(rank) {}
  std::string_view kind() const override { return "in-process"; }
  int rank() const override { return rank_; }
  int size() const override { return group_->size; }

  absl::StatusOr<std::vector<std::string>> AllGather(std::string_view channel,
                                                     std::string_view bytes) override {
    PS_RETURN_IF_ERROR(CheckChannel(channel));
    return Exchange(channel, bytes);
  }

  void Abort() override {
    {
      std::lock_guard<std::mutex> lock(group_->mu);
      aborted_.store(true, std::memory_order_release);
    }
    group_->cv.notify_all();
  }

  absl::Status Failure() override {
    std::lock_guard<std::mutex> lock(group_->mu);
    return group_->failure.has_value() ? absl::AbortedError(*group_->failure) : absl::OkStatus();
  }

  void Fail(std::string_view reason) override {
    {
      std::lock_guard<std::mutex> lock(group_->mu);
      if (!group_->failure.has_value()) {
        group_->failure = absl::StrCat("process ", rank_, " failed: ", Absl(reason));
      }
    }
    group_->cv.notify_all();
  }

  absl::Status Send(int to, std::string_view channel, std::string_view bytes) override {
    PS_RETURN_IF_ERROR(CheckPointToPoint(to, channel));
    Group& g = *group_;
    {
      std::lock_guard<std::mutex> lock(g.mu);
      if (aborted_.load(std::memory_order_acquire)) {
        return absl::CancelledError(absl::StrCat("bootstrap rank ", rank_, ": aborted on channel '",
                                                 Absl(channel), "' (sending to rank ", to, ")"));
      }
      if (g.failure.has_value()) return absl::AbortedError(*g.failure);
      g.mail[{rank_, to, std::string(channel)}].emplace_back(bytes);
    }
    g.cv.notify_all();
    return absl::OkStatus();
  }

  absl::StatusOr<std::string> Receive(int from, std::string_view channel) override {
    PS_RETURN_IF_ERROR(CheckPointToPoint(from, channel));
    Group& g = *group_;
    std::int64_t k;  // counted once received: a failed Receive leaves the number
    {
      std::lock_guard<std::mutex> lock(seq_mu_);
      k = received_[{from, std::string(channel)}];
    }
    const std::optional<Clock::time_point> deadline = DeadlineAfter(g.options.timeout_seconds);
    std::unique_lock<std::mutex> lock(g.mu);
    std::deque<std::string>& box = g.mail[{from, rank_, std::string(channel)}];
    auto ready = [&] {
      return !box.empty() || aborted_.load(std::memory_order_acquire) || g.failure.has_value();
    };
    if (deadline.has_value()) {
      g.cv.wait_until(lock, *deadline, ready);
    } else {
      g.cv.wait(lock, ready);
    }
    // A failed job's messages are not delivered (Aborted, as the other kinds do).
    if (!box.empty() && !aborted_.load(std::memory_order_acquire) && !g.failure.has_value()) {
      std::string out = std::move(box.front());
      box.pop_front();
      lock.unlock();
      std::lock_guard<std::mutex> seq_lock(seq_mu_);
      ++received_[{from, std::string(channel)}];
      return out;
    }
    if (aborted_.load(std::memory_order_acquire)) {
      return absl::CancelledError(absl::StrCat("bootstrap rank ", rank_, ": aborted on channel '",
                                               Absl(channel), "' (message ", k, " from rank ", from,
                                               ")"));
    }
    if (g.failure.has_value()) return absl::AbortedError(*g.failure);
    return absl::DeadlineExceededError(absl::StrCat(
        "in-process bootstrap: rank ", rank_, " waited ", g.options.timeout_seconds,
        " s on channel '", Absl(channel), "' (message ", k, ") for a message from rank ", from,
        " (not started, not sending it, or failed earlier?)"));
  }

  absl::Status Close() override {
    if (closed_) return absl::OkStatus();
    PS_RETURN_IF_ERROR(Exchange(kCloseChannel, "").status());
    closed_ = true;
    return absl::OkStatus();
  }

 private:
  absl::Status CheckPointToPoint(int peer, std::string_view channel) const {
    PS_RETURN_IF_ERROR(CheckChannel(channel));
    PS_RETURN_IF_ERROR(internal::CheckPeer(peer, rank_, group_->size));
    if (closed_) {
      return absl::InvalidArgumentError(
          absl::StrCat("bootstrap rank ", rank_, ": Send or Receive after Close()"));
    }
    return absl::OkStatus();
  }

  absl::StatusOr<std::vector<std::string>> Exchange(std::string_view channel,
                                                    std::string_view bytes) {
    if (closed_) {
      return absl::InvalidArgumentError(
          absl::StrCat("bootstrap rank ", rank_, ": AllGather after Close()"));
    }
    Group& g = *group_;
    std::int64_t k;
    {
      std::lock_guard<std::mutex> lock(seq_mu_);
      k = next_[std::string(channel)]++;
    }
    const auto key = std::make_pair(std::string(channel), k);
    const std::optional<Clock::time_point> deadline = DeadlineAfter(g.options.timeout_seconds);
    std::unique_lock<std::mutex> lock(g.mu);
    auto cancelled = [&] {
      return absl::CancelledError(absl::StrCat("bootstrap rank ", rank_, ": aborted on channel '",
                                               Absl(channel), "' (exchange ", k, ")"));
    };
    if (aborted_.load(std::memory_order_acquire)) return cancelled();
    if (g.failure.has_value()) return absl::AbortedError(*g.failure);
    Round& round = g.rounds.try_emplace(key, g.size).first->second;
    round.slots[rank_] = std::string(bytes);
    if (++round.arrived == g.size) g.cv.notify_all();
    auto ready = [&] {
      return round.arrived == g.size || aborted_.load(std::memory_order_acquire) ||
             g.failure.has_value();
    };
    bool in_time = true;
    if (deadline.has_value()) {
      in_time = g.cv.wait_until(lock, *deadline, ready);
    } else {
      g.cv.wait(lock, ready);
    }
    if (round.arrived == g.size) {
      std::vector<std::string> out;
      out.reserve(g.size);
      for (const std::optional<std::string>& slot : round.slots) out.push_back(*slot);
      if (++round.taken == g.size) g.rounds.erase(key);
      return out;
    }
    if (g.failure.has_value()) return absl::AbortedError(*g.failure);
    if (!in_time) {
      std::vector<bool> present;
      for (const std::optional<std::string>& slot : round.slots) {
        present.push_back(slot.has_value());
      }
      return absl::DeadlineExceededError(
          absl::StrCat("in-process bootstrap: rank ", rank_, " waited ", g.options.timeout_seconds,
                       " s on channel '", Absl(channel), "' (exchange ", k, ") for ",
                       MissingRanks(present), " (not started, or failed earlier?)"));
    }
    return cancelled();
  }

  std::shared_ptr<Group> group_;
  const int rank_;
  std::atomic<bool> aborted_{false};
  std::mutex seq_mu_;
  std::map<std::string, std::int64_t, std::less<>> next_;
  std::map<std::pair<int, std::string>, std::int64_t> received_;  // Receive: by (from, channel)
  bool closed_ = false;
};

// ---------------------------------------------------------------------------------------
// File

std::string ErrnoText(int err) { return std::strerror(err); }

// Writes `content` to `tmp` and links it to `path`, so that readers see all of it or
// nothing; `tmp` is removed either way. False when `path` exists already (it is left as
// it is).
absl::StatusOr<bool> LinkNewFile(const std::string& tmp, const std::string& path,
                                 std::string_view content) {
  {
    ScopedFd fd(::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644));
    if (fd.get() < 0) {
      return absl::InternalError(absl::StrCat("file bootstrap: cannot create ",
                                              QuoteForMessage(tmp, 200), ": ", ErrnoText(errno)));
    }
    std::size_t done = 0;
    while (done < content.size()) {
      const ssize_t n = ::write(fd.get(), content.data() + done, content.size() - done);
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) {
        const int err = errno;
        (void)::unlink(tmp.c_str());
        return absl::InternalError(absl::StrCat("file bootstrap: cannot write ",
                                                QuoteForMessage(tmp, 200), ": ", ErrnoText(err)));
      }
      done += static_cast<std::size_t>(n);
    }
  }
  const int linked = ::link(tmp.c_str(), path.c_str());
  const int err = errno;
  (void)::unlink(tmp.c_str());
  if (linked == 0) return true;
  if (err == EEXIST) return false;
  return absl::InternalError(absl::StrCat("file bootstrap: cannot link ",
                                          QuoteForMessage(path, 200), ": ", ErrnoText(err)));
}

// The `failed` marker's content: "<rank>\n<reason on one line of at most 1000 bytes>"
// (it is quoted in the others' errors).
std::string FailureMarker(int rank, std::string_view reason) {
  return absl::StrCat(rank, "\n", internal::FailureReason(reason));
}

// Wakes a file bootstrap's receives when their message appears in its directory
// (created or hard-linked into place; inotify), so that a crossing's receive need not
// sleep out its polling interval. One thread reads the directory's events and wakes only
// the waits registered for the name that came (and every wait for the `failed` marker);
// a wait registers before its first look, so no event between a look and its sleep is
// lost. Events of other hosts' writes over a shared file system do not come: the
// intervals stay the waits' schedule. Exchanges (every rank's file on each look) do not
// use it: waking each of them for each rank's file costs more CPU than it saves.
class DirectoryEvents {
 public:
  // Null where the directory cannot be watched (no inotify, its per-user limit reached,
  // no thread to be had): the waits then only poll.
  static std::unique_ptr<DirectoryEvents> Open(const std::filesystem::path& dir) {
    ScopedFd inotify(::inotify_init1(IN_NONBLOCK | IN_CLOEXEC));
    if (inotify.get() < 0) return nullptr;
    if (::inotify_add_watch(inotify.get(), dir.c_str(), IN_CREATE | IN_MOVED_TO | IN_ONLYDIR) < 0) {
      return nullptr;
    }
    ScopedFd stop(::eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC));
    if (stop.get() < 0) return nullptr;
    auto events = std::unique_ptr<DirectoryEvents>(new DirectoryEvents());
    events->inotify_ = std::move(inotify);
    events->stop_ = std::move(stop);
    try {
      events->thread_ = std::thread([e = events.get()] { e->Run(); });
    } catch (const std::system_error&) {
      return nullptr;  // (the destructor joins only a thread that started)
    }
    return events;
  }
  ~DirectoryEvents() {
    if (!thread_.joinable()) return;
    const std::uint64_t one = 1;
    (void)!::write(stop_.get(), &one, sizeof(one));
    thread_.join();
  }
  DirectoryEvents(const DirectoryEvents&) = delete;
  DirectoryEvents& operator=(const DirectoryEvents&) = delete;

  // A wait for the entry `name` of the directory, registered while it lives (`events`
  // may be null: then Sleep only sleeps).
  class Wait {
   public:
    Wait(DirectoryEvents* events, std::string name) : events_(events), name_(std::move(name)) {
      if (events_ == nullptr) return;
      std::lock_guard<std::mutex> lock(events_->mu_);
      events_->waits_.push_back(this);
    }
    ~Wait() {
      if (events_ == nullptr) return;
      std::lock_guard<std::mutex> lock(events_->mu_);
      std::erase(events_->waits_, this);
    }
    Wait(const Wait&) = delete;
    Wait& operator=(const Wait&) = delete;
    // Returns once `name` (or a failure marker) has appeared since the last call (or
    // since the wait began), or after `timeout`.
    void Sleep(std::chrono::microseconds timeout) {
      if (events_ == nullptr) {
        std::this_thread::sleep_for(timeout);
        return;
      }
      std::unique_lock<std::mutex> lock(events_->mu_);
      cv_.wait_for(lock, timeout, [&] { return arrived_ != seen_; });
      seen_ = arrived_;
    }

   private:
    friend class DirectoryEvents;
    DirectoryEvents* const events_;
    const std::string name_;
    std::condition_variable cv_;
    std::uint64_t arrived_ = 0, seen_ = 0;  // under events_->mu_
  };

 private:
  DirectoryEvents() = default;

  // Wakes the waits for `name` (all of them for the failure marker, or for an event
  // whose name the queue's overflow lost).
  void Arrived(std::string_view name) {
    std::lock_guard<std::mutex> lock(mu_);
    for (Wait* wait : waits_) {
      if (name.empty() || name == "failed" || wait->name_ == name) {
        ++wait->arrived_;
        wait->cv_.notify_one();
      }
    }
  }

  void Run() {
    alignas(struct inotify_event) char buffer[8192];
    for (;;) {
      struct pollfd fds[2] = {{.fd = inotify_.get(), .events = POLLIN, .revents = 0},
                              {.fd = stop_.get(), .events = POLLIN, .revents = 0}};
      if (::poll(fds, 2, -1) < 0) {
        if (errno == EINTR) continue;
        return;  // the waits keep their intervals
      }
      if (fds[1].revents != 0) return;
      if (fds[0].revents == 0) continue;
      for (;;) {
        const ssize_t n = ::read(inotify_.get(), buffer, sizeof(buffer));
        if (n < 0 && errno == EINTR) continue;
        if (n <= 0) break;  // drained (EAGAIN)
        for (ssize_t at = 0; at < n;) {
          const auto* event = reinterpret_cast<const struct inotify_event*>(buffer + at);
          // A writer's temporary (".tmp..."): its linked name comes next. No name: the
          // queue overflowed (or the directory went), which may hide anything.
          if (event->len == 0) {
            Arrived("");
          } else if (event->name[0] != '.') {
            Arrived(std::string_view(event->name));  // (NUL-padded to len)
          }
          at += static_cast<ssize_t>(sizeof(struct inotify_event) + event->len);
        }
      }
    }
  }

  ScopedFd inotify_, stop_;
  std::mutex mu_;
  std::vector<Wait*> waits_;  // under mu_
  std::thread thread_;
};

class FileBootstrap final : public Bootstrap {
 public:
  FileBootstrap(std::filesystem::path dir, int rank, int size, BootstrapOptions options)
      : dir_(std::move(dir)), rank_(rank), size_(size), options_(options), watch_(size) {}
  ~FileBootstrap() override { StopBeating(); }
  FileBootstrap(const FileBootstrap&) = delete;
  FileBootstrap& operator=(const FileBootstrap&) = delete;
  std::string_view kind() const override { return "file"; }
  int rank() const override { return rank_; }
  int size() const override { return size_; }

  // Rank 0 makes the directory and its job file; the others wait for the job file.
  absl::Status Join() {
    const std::string job = (dir_ / "job").string();
    const std::string expected = absl::StrCat("pipesched-bootstrap 1\nsize ", size_, "\n");
    if (rank_ == 0) {
      // An existing directory is refused, never reused or marked: it may be a live job's
      // (the same path given twice), which must not be touched.
      const int err = ::mkdir(dir_.c_str(), 0755) == 0 ? 0 : errno;
      if (err == EEXIST) {
        return absl::FailedPreconditionError(absl::StrCat(
            "rendezvous directory ", QuoteForMessage(dir_.string(), 200),
            " exists (an earlier run that did not close left it, or another job uses it?): "
            "remove it, or give every run a new path"));
      }
      if (err != 0) {
        return absl::FailedPreconditionError(absl::StrCat("cannot create rendezvous directory ",
                                                          QuoteForMessage(dir_.string(), 200), ": ",
                                                          ErrnoText(err)));
      }
      PS_RETURN_IF_ERROR(WriteFileAtomic(job, expected));
      return HoldAliveLock();
    }
    const std::optional<Clock::time_point> deadline = DeadlineAfter(options_.timeout_seconds);
    for (Backoff wait; !Exists(job);) {
      PS_RETURN_IF_ERROR(Failure());
      if (aborted_.load(std::memory_order_acquire)) {
        return absl::CancelledError(
            absl::StrCat("file bootstrap rank ", rank_, ": aborted while waiting for rank 0"));
      }
      if (deadline.has_value() && Clock::now() >= *deadline) {
        return absl::DeadlineExceededError(
            absl::StrCat("file bootstrap rank ", rank_, ": rank 0 did not create ",
                         QuoteForMessage(dir_.string(), 200), " within ", options_.timeout_seconds,
                         " s (is rank 0 running, with the same rendezvous path?)"));
      }
      wait.Sleep();
    }
    PS_ASSIGN_OR_RETURN(const std::string got, ReadFile(job, 4096));
    if (got != expected) {
      std::string theirs = got;
      if (const std::size_t at = theirs.find("size "); at != std::string::npos) {
        theirs = theirs.substr(at + 5);
        if (!theirs.empty() && theirs.back() == '\n') theirs.pop_back();
      }
      const std::string message =
          absl::StrCat("rank ", rank_, " was started for ", size_, " processes, but rank 0 made ",
                       QuoteForMessage(dir_.string(), 200), " for ", QuoteForMessage(theirs),
                       ": give every process the same number of processes");
      Fail(message);  // rank 0 and the others stop now
      return absl::InvalidArgumentError(message);
    }
    return HoldAliveLock();
  }

  absl::StatusOr<std::vector<std::string>> AllGather(std::string_view channel,
                                                     std::string_view bytes) override {
    PS_RETURN_IF_ERROR(CheckChannel(channel));
    return Exchange(channel, bytes);
  }

  absl::Status Send(int to, std::string_view channel, std::string_view bytes) override {
    PS_RETURN_IF_ERROR(CheckPointToPoint(to, channel));
    if (aborted_.load(std::memory_order_acquire)) {
      return absl::CancelledError(absl::StrCat("file bootstrap rank ", rank_,
                                               ": aborted on channel '", Absl(channel),
                                               "' (sending to rank ", to, ")"));
    }
    PS_RETURN_IF_ERROR(Failure());
    // Counted once written (a failed write leaves no gap the receiver would wait on);
    // calls on one (peer, channel) do not overlap, so nothing takes this number meanwhile.
    std::int64_t k;
    {
      std::lock_guard<std::mutex> lock(seq_mu_);
      k = sent_[{to, std::string(channel)}];
    }
    std::call_once(beat_started_, [this] { StartBeating(); });
    PS_RETURN_IF_ERROR(PutFile(MessageFileOf(channel, k, rank_, to), bytes));
    std::lock_guard<std::mutex> lock(seq_mu_);
    ++sent_[{to, std::string(channel)}];
    return absl::OkStatus();
  }

  absl::StatusOr<std::string> Receive(int from, std::string_view channel) override {
    PS_RETURN_IF_ERROR(CheckPointToPoint(from, channel));
    std::int64_t k;  // counted once received: a failed Receive leaves the number
    {
      std::lock_guard<std::mutex> lock(seq_mu_);
      k = received_[{from, std::string(channel)}];
    }
    std::call_once(beat_started_, [this] { StartBeating(); });
    const std::optional<Clock::time_point> deadline = DeadlineAfter(options_.timeout_seconds);
    const std::string path = MessageFileOf(channel, k, from, rank_);
    DirectoryEvents::Wait arrival(Events(), std::filesystem::path(path).filename().string());
    for (Backoff wait{.wait = &arrival};;) {
      if (aborted_.load(std::memory_order_acquire)) {
        return absl::CancelledError(absl::StrCat("file bootstrap rank ", rank_,
                                                 ": aborted on channel '", Absl(channel),
                                                 "' (message ", k, " from rank ", from, ")"));
      }
      // A failed job's messages are not delivered (Aborted, as the other kinds do).
      PS_RETURN_IF_ERROR(Failure());
      if (Exists(path)) {
        PS_ASSIGN_OR_RETURN(std::string out,
                            ReadFile(path, std::numeric_limits<std::int64_t>::max()));
        (void)::unlink(path.c_str());
        std::lock_guard<std::mutex> lock(seq_mu_);
        ++received_[{from, std::string(channel)}];
        return out;
      }
      if (deadline.has_value() && Clock::now() >= *deadline) {
        return absl::DeadlineExceededError(
            absl::StrCat("file bootstrap ", QuoteForMessage(dir_.string(), 200), ": rank ", rank_,
                         " waited ", options_.timeout_seconds, " s on channel '", Absl(channel),
                         "' (message ", k, ") for a message from rank ", from,
                         " (not started, not sending it, failed earlier, or given another path?)"));
      }
      wait.Sleep();
    }
  }

  void Abort() override { aborted_.store(true, std::memory_order_release); }

  void Fail(std::string_view reason) override {
    (void)PutFile((dir_ / "failed").string(), FailureMarker(rank_, reason));
    // This rank's next Failure() reads the marker, not only one within a millisecond
    // (FailedMarker's throttle): a caller that failed must see the job failed.
    failed_seen_.store(true, std::memory_order_release);
  }

  absl::Status Close() override {
    if (closed_) return absl::OkStatus();
    PS_RETURN_IF_ERROR(Exchange(kCloseChannel, "").status());
    closed_.store(true, std::memory_order_release);
    // Every rank has reached Close, so every other exchange has been read by everyone.
    {
      std::lock_guard<std::mutex> lock(seq_mu_);
      for (const auto& [channel, next] : next_) {
        if (channel != kCloseChannel) (void)::unlink(FileOf(channel, next - 1, rank_).c_str());
      }
    }
    // No beat after the gone file: rank 0 may be removing the directory then, which a
    // file made in it would keep from going.
    StopBeating();
    PS_RETURN_IF_ERROR(PutFile((dir_ / absl::StrCat("gone.", rank_)).string(), ""));
    // The gone file says this rank left; its lock is not needed any more, and an open
    // file would keep rank 0 from removing the directory on NFS (it stays as .nfsXXXX).
    alive_fd_ = ScopedFd();
    // From here on rank 0 may remove the files in any order: looking for ended ranks
    // among them could find an alive file whose gone file went first.
    if (rank_ != 0) {
      left_.store(true, std::memory_order_release);
      return absl::OkStatus();
    }
    // Rank 0 waits until every rank has read the close exchange, then removes the rest.
    std::vector<bool> gone(size_, false);
    const std::optional<Clock::time_point> deadline = DeadlineAfter(options_.timeout_seconds);
    for (Backoff wait = ExchangeBackoff();;) {
      for (int r = 0; r < size_; ++r) {
        if (!gone[r]) gone[r] = Exists((dir_ / absl::StrCat("gone.", r)).string());
      }
      if (std::all_of(gone.begin(), gone.end(), [](bool g) { return g; })) break;
      PS_RETURN_IF_ERROR(Failure());
      if (deadline.has_value() && Clock::now() >= *deadline) {
        return absl::DeadlineExceededError(
            absl::StrCat("file bootstrap: rank 0 waited ", options_.timeout_seconds, " s for ",
                         MissingRanks(gone), " to close; ", QuoteForMessage(dir_.string(), 200),
                         " is left behind: remove it"));
      }
      wait.Sleep();
    }
    left_.store(true, std::memory_order_release);
    // A rank that has just linked its gone file may still be removing the temporary file
    // it linked it from (PutFile): an entry that vanishes while remove_all walks the
    // directory fails it with ENOENT, and a second walk finds the rest.
    std::error_code ec;
    for (int attempt = 0; attempt < 5; ++attempt) {
      ec.clear();
      std::filesystem::remove_all(dir_, ec);
      if (ec != std::errc::no_such_file_or_directory) break;
    }
    if (ec && std::filesystem::exists(dir_)) {
      return absl::InternalError(absl::StrCat("cannot remove rendezvous directory ",
                                              QuoteForMessage(dir_.string(), 200), ": ",
                                              ec.message()));
    }
    return absl::OkStatus();
  }

 private:
  // Sleeps 0.1 ms, doubling up to `first_cap` (1 ms) for the first second of a wait,
  // then on up to 20 ms: quick when the others are close behind (a pipeline's crossing,
  // whose receive is posted well before its message comes, is picked up within about
  // 1 ms of it, where a 20 ms cap left it up to 20 ms late: docs/benchmarks.md, *A sweep
  // as a job of several processes*), cheap when they are far (a process still starting,
  // a straggler; on NFS, each look is a request to the server).
  // With `wait`, a sleep also ends when the file it waits for appears (DirectoryEvents).
  struct Backoff {
    std::chrono::microseconds first_cap{1000};
    DirectoryEvents::Wait* wait = nullptr;
    Clock::time_point start = Clock::now();
    std::chrono::microseconds next{100};
    void Sleep() {
      if (wait != nullptr) {
        wait->Sleep(next);
      } else {
        std::this_thread::sleep_for(next);
      }
      const std::chrono::microseconds cap = Clock::now() - start < std::chrono::seconds(1)
                                                ? first_cap
                                                : std::chrono::milliseconds(20);
      next = std::min<std::chrono::microseconds>(next * 2, cap);
    }
  };
  // An exchange's wait looks for every missing rank's file each time: its first second
  // polls at 1 ms for up to 8 ranks, and proportionally less often for more (a look
  // every 8 ms at 64 ranks), so that a process makes at most ~8 looks a millisecond.
  Backoff ExchangeBackoff() const {
    return Backoff{
        .first_cap = std::min<std::chrono::microseconds>(
            std::chrono::microseconds(125) * std::max(size_, 8), std::chrono::milliseconds(20))};
  }
  // The directory's events (BootstrapOptions::watch_directory), watched from the first
  // receive on (as the heartbeat starts with the first exchange: a process that forks
  // after joining has no thread to copy); null when not watched.
  DirectoryEvents* Events() {
    if (!options_.watch_directory || size_ == 1) return nullptr;
    std::call_once(events_started_, [this] { events_ = DirectoryEvents::Open(dir_); });
    return events_.get();
  }

  static bool Exists(const std::string& path) { return ::access(path.c_str(), F_OK) == 0; }

 public:
  // Aborted "process <r> failed: <reason>" once a rank has called Fail() (a marker much
  // older than this process is an earlier run's, a rank that joined a directory rank 0
  // then refused: the message says so); else Aborted "process <r> (pid <p>) ended
  // without leaving the job ..." once a rank's process has ended without Close()
  // (LookForEndedRanks); else OK.
  absl::Status Failure() override {
    {
      std::lock_guard<std::mutex> lock(ended_mu_);
      if (ended_.has_value()) return absl::AbortedError(*ended_);
    }
    PS_RETURN_IF_ERROR(FailedMarker());
    const std::int64_t now = NowMicros();
    PS_RETURN_IF_ERROR(LookForEndedRanks(now));
    return LookForSilentRanks(now);
  }

 private:
  static std::int64_t NowMicros() {
    return std::chrono::duration_cast<std::chrono::microseconds>(Clock::now().time_since_epoch())
        .count();
  }

  // The `failed` marker's part of Failure(). `throttled`: a watchdog may ask every few
  // microseconds; one look per millisecond is enough.
  absl::Status FailedMarker(bool throttled = true) {
    const std::int64_t now = NowMicros();
    const std::int64_t last = last_failure_look_.load(std::memory_order_relaxed);
    if (throttled && !failed_seen_.load(std::memory_order_acquire) && last != 0 &&
        now - last < 1000) {
      return absl::OkStatus();
    }
    last_failure_look_.store(now, std::memory_order_relaxed);
    const std::string path = (dir_ / "failed").string();
    if (!Exists(path)) return absl::OkStatus();
    failed_seen_.store(true, std::memory_order_release);
    absl::StatusOr<std::string> text = ReadFile(path, 4096);
    if (!text.ok()) return absl::AbortedError("a process failed (its reason is unreadable)");
    const std::size_t nl = text->find('\n');
    std::string old;
    if (const std::optional<std::int64_t> age = SecondsBeforeThisProcess(path)) {
      old = absl::StrCat(" (written ", *age,
                         " s before this process started: ", QuoteForMessage(dir_.string(), 200),
                         " is an earlier run's? remove it)");
    }
    return absl::AbortedError(
        absl::StrCat("process ", text->substr(0, nl),
                     " failed: ", nl == std::string::npos ? "" : text->substr(nl + 1), old));
  }

  // How long before this process joined `path` was written, when that is more than 10 s
  // (a file of an earlier run's directory, most likely); nullopt otherwise.
  std::optional<std::int64_t> SecondsBeforeThisProcess(const std::string& path) const {
    std::error_code ec;
    const auto written = std::filesystem::last_write_time(path, ec);
    if (ec || written + std::chrono::seconds(10) >= started_) return std::nullopt;
    return std::chrono::duration_cast<std::chrono::seconds>(started_ - written).count();
  }

  // Before this rank's first exchange, a rank's file written long before this process
  // started may be an earlier run's (a directory left behind, which a rank started before
  // rank 0 joins): "; it <did> N s before this process started: is DIR an earlier run's?
  // remove it"; empty otherwise.
  std::string EarlierRunHint(const std::string& file, std::string_view did) const {
    if (exchanged_.load(std::memory_order_acquire)) return "";
    const std::optional<std::int64_t> age = SecondsBeforeThisProcess(file);
    if (!age.has_value()) return "";
    return absl::StrCat("; it ", Absl(did), " ", *age, " s before this process started: is ",
                        QuoteForMessage(dir_.string(), 200), " an earlier run's? remove it");
  }

  // Aborted with the first rank found gone (`message`, kept: Failure() says it again).
  absl::Status Ended(std::string message) {
    std::lock_guard<std::mutex> lock(ended_mu_);
    if (!ended_.has_value()) ended_ = std::move(message);
    return absl::AbortedError(*ended_);
  }

  std::string AliveFile(int rank) const { return (dir_ / absl::StrCat("alive.", rank)).string(); }

  enum class Liveness { kUnknown, kAlive, kEnded };
  // Whether `rank`'s process holds its alive file's lock. kUnknown: no file (not joined
  // yet, a file system without flock, or the directory is gone), or a rank on another
  // host (another boot id): a shared file system may keep locks per machine, so that
  // only on this host does a lock that can be taken mean its holder has gone. `pid`
  // gets the file's pid for kEnded.
  Liveness Probe(int rank, std::string* pid) const {
    ScopedFd fd(::open(AliveFile(rank).c_str(), O_RDONLY | O_CLOEXEC));
    if (fd.get() < 0) return Liveness::kUnknown;
    // Closing `fd` drops the shared lock this takes from an ended rank's file.
    if (::flock(fd.get(), LOCK_SH | LOCK_NB) != 0) {
      return errno == EWOULDBLOCK ? Liveness::kAlive : Liveness::kUnknown;
    }
    char text[128] = {};
    const ssize_t n = ::read(fd.get(), text, sizeof(text) - 1);
    const std::string_view content(text, n > 0 ? static_cast<std::size_t>(n) : 0);
    const std::size_t space = content.find(' ');
    if (space == std::string_view::npos || BootId().empty()) return Liveness::kUnknown;
    std::string_view boot = content.substr(space + 1);
    if (!boot.empty() && boot.back() == '\n') boot.remove_suffix(1);
    if (boot != BootId()) return Liveness::kUnknown;
    *pid = std::string(content.substr(0, space));
    return Liveness::kEnded;
  }

  // This machine's boot id (Linux: /proc/sys/kernel/random/boot_id), which tells the
  // ranks on this host from the others; empty when it cannot be read.
  static const std::string& BootId() {
    static const std::string id = [] {
      absl::StatusOr<std::string> text = ReadFile("/proc/sys/kernel/random/boot_id", 128);
      std::string out = text.ok() ? *text : std::string();
      while (!out.empty() && (out.back() == '\n' || out.back() == ' ')) out.pop_back();
      return out.find_first_of(" \n") == std::string::npos ? out : std::string();
    }();
    return id;
  }

  // Takes this rank's alive file (the file layout above) for as long as the bootstrap
  // lives; the kernel drops it however the process ends. Refuses a rank whose file a
  // live process holds. On a file system without flock there is no file, and a rank
  // that ends without Close() is found by the others' timeout only.
  absl::Status HoldAliveLock() {
    std::string pid;
    if (Probe(rank_, &pid) == Liveness::kAlive) {
      return absl::FailedPreconditionError(absl::StrCat(
          "file bootstrap ", QuoteForMessage(dir_.string(), 200), ": another live process is rank ",
          rank_, " (it holds ", QuoteForMessage(AliveFile(rank_), 200),
          "): give each process its own rank"));
    }
    const std::string tmp =
        (dir_ / absl::StrCat(".tmp.alive.", rank_, ".", ::getpid(), ".", tmp_counter_++)).string();
    ScopedFd fd(::open(tmp.c_str(), O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC, 0644));
    if (fd.get() < 0) {
      return absl::InternalError(absl::StrCat("file bootstrap: cannot create ",
                                              QuoteForMessage(tmp, 200), ": ", ErrnoText(errno)));
    }
    if (::flock(fd.get(), LOCK_EX | LOCK_NB) != 0) {  // no flock on this file system
      (void)::unlink(tmp.c_str());
      return absl::OkStatus();
    }
    const std::string text = absl::StrCat(::getpid(), " ", BootId(), "\n");
    if (::write(fd.get(), text.data(), text.size()) != static_cast<ssize_t>(text.size()) ||
        ::rename(tmp.c_str(), AliveFile(rank_).c_str()) != 0) {
      const int err = errno;
      (void)::unlink(tmp.c_str());
      return absl::InternalError(absl::StrCat("file bootstrap: cannot write ",
                                              QuoteForMessage(AliveFile(rank_), 200), ": ",
                                              ErrnoText(err)));
    }
    alive_fd_ = std::move(fd);
    return absl::OkStatus();
  }

  // Aborted naming the first rank whose process ended without Close(), once found; OK
  // otherwise. Looks every 50 ms at most, at up to kProbesPerLook ranks each time, in
  // turn (an open and a flock each), and not at all once this rank has left. A rank is
  // ended when its alive file is unlocked and, looked at afterwards, it has no gone
  // file: a rank that closed wrote that file before its lock was dropped.
  absl::Status LookForEndedRanks(std::int64_t now_micros) {
    constexpr int kProbesPerLook = 16;
    if (left_.load(std::memory_order_acquire) || size_ == 1) return absl::OkStatus();
    const std::int64_t last = last_alive_look_.load(std::memory_order_relaxed);
    if (last != 0 && now_micros - last < 50'000) return absl::OkStatus();
    std::unique_lock<std::mutex> probing(probe_mu_, std::try_to_lock);
    if (!probing.owns_lock()) return absl::OkStatus();  // another thread is looking
    last_alive_look_.store(now_micros, std::memory_order_relaxed);
    for (int i = 0; i < std::min(kProbesPerLook, size_ - 1); ++i) {
      const int r = next_probe_;
      next_probe_ = (next_probe_ + 1) % size_;
      if (next_probe_ == rank_) next_probe_ = (next_probe_ + 1) % size_;
      if (r == rank_) continue;
      std::string pid;
      if (Probe(r, &pid) != Liveness::kEnded) continue;
      if (Exists((dir_ / absl::StrCat("gone.", r)).string())) continue;
      // A rank that said why before it ended is reported with its reason.
      PS_RETURN_IF_ERROR(FailedMarker(/*throttled=*/false));
      return Ended(absl::StrCat("process ", r, " (pid ", pid,
                                ") ended without leaving the job (killed, crashed, or exited "
                                "early?)",
                                EarlierRunHint(AliveFile(r), "joined")));
    }
    return absl::OkStatus();
  }

  std::string FileOf(std::string_view channel, std::int64_t k, int rank) const {
    return (dir_ / absl::StrCat(Absl(channel), ".", k, ".", rank)).string();
  }

  std::string MessageFileOf(std::string_view channel, std::int64_t k, int from, int to) const {
    return (dir_ / absl::StrCat(Absl(channel), ".", k, ".", from, "-", to)).string();
  }

  absl::Status CheckPointToPoint(int peer, std::string_view channel) const {
    PS_RETURN_IF_ERROR(CheckChannel(channel));
    PS_RETURN_IF_ERROR(internal::CheckPeer(peer, rank_, size_));
    if (closed_.load(std::memory_order_acquire)) {
      return absl::InvalidArgumentError(
          absl::StrCat("bootstrap rank ", rank_, ": Send or Receive after Close()"));
    }
    return absl::OkStatus();
  }

  // Writes `content` beside `path` and links it into place: readers see all or nothing,
  // and a file already at `path` (a second process with this rank) is an error.
  absl::Status PutFile(const std::string& path, std::string_view content) {
    const std::string tmp =
        (dir_ / absl::StrCat(".tmp.", rank_, ".", ::getpid(), ".", tmp_counter_++)).string();
    PS_ASSIGN_OR_RETURN(const bool linked, LinkNewFile(tmp, path, content));
    if (linked) return absl::OkStatus();
    PS_RETURN_IF_ERROR(FailedMarker());  // the run failed already: say why
    return absl::FailedPreconditionError(absl::StrCat(
        "file bootstrap: ", QuoteForMessage(path, 200), " exists: another process is rank ", rank_,
        " too (give each process its own rank), or the directory is an earlier run's "
        "(remove it)"));
  }

  absl::StatusOr<std::vector<std::string>> Exchange(std::string_view channel,
                                                    std::string_view bytes) {
    if (closed_) {
      return absl::InvalidArgumentError(
          absl::StrCat("bootstrap rank ", rank_, ": AllGather after Close()"));
    }
    std::int64_t k;
    {
      std::lock_guard<std::mutex> lock(seq_mu_);
      k = next_[std::string(channel)]++;
    }
    // The heartbeat starts with the first exchange: a rank that has come and then lost its
    // host while the others were still on their way is judged too. (Not at joining: a
    // process that forks right after joining, as tests do, has no thread of it to copy.)
    std::call_once(beat_started_, [this] { StartBeating(); });
    const std::optional<Clock::time_point> deadline = DeadlineAfter(options_.timeout_seconds);
    PS_RETURN_IF_ERROR(PutFile(FileOf(channel, k, rank_), bytes));
    std::vector<std::string> out(size_);
    std::vector<bool> have(size_, false);
    out[rank_] = std::string(bytes);
    have[rank_] = true;
    for (Backoff wait = ExchangeBackoff();;) {
      for (int r = 0; r < size_; ++r) {
        if (have[r]) continue;
        const std::string path = FileOf(channel, k, r);
        if (!Exists(path)) continue;
        PS_ASSIGN_OR_RETURN(out[r], ReadFile(path, std::numeric_limits<std::int64_t>::max()));
        have[r] = true;
        if (channel == kCloseChannel) {
          // It has come to leave, and stops beating once the close exchange is done: its
          // silence from here on is not judged (its gone file may show late on NFS).
          std::lock_guard<std::mutex> lock(watch_mu_);
          watch_[r].closing = true;
        }
      }
      if (std::all_of(have.begin(), have.end(), [](bool h) { return h; })) break;
      PS_RETURN_IF_ERROR(Failure());
      if (aborted_.load(std::memory_order_acquire)) {
        return absl::CancelledError(absl::StrCat("file bootstrap rank ", rank_,
                                                 ": aborted on channel '", Absl(channel),
                                                 "' (exchange ", k, ")"));
      }
      if (deadline.has_value() && Clock::now() >= *deadline) {
        return absl::DeadlineExceededError(absl::StrCat(
            "file bootstrap ", QuoteForMessage(dir_.string(), 200), ": rank ", rank_, " waited ",
            options_.timeout_seconds, " s on channel '", Absl(channel), "' (exchange ", k, ") for ",
            MissingRanks(have), " (not started, failed earlier, or given another path?)"));
      }
      wait.Sleep();
    }
    if (k > 0) (void)::unlink(FileOf(channel, k - 1, rank_).c_str());
    exchanged_.store(true, std::memory_order_release);
    return out;
  }

  // The heartbeat (the file layout above; BootstrapOptions::heartbeat_timeout_seconds).
  static constexpr std::int64_t kBeatMicros = 1'000'000;    // between two beats
  static constexpr std::int64_t kBeatLookMicros = 250'000;  // between two looks
  static constexpr int kBeatsPerLook = 16;                  // ranks read per look

  std::string BeatFile(int rank) const { return (dir_ / absl::StrCat("beat.", rank)).string(); }

  void StartBeating() {
    if (size_ == 1) return;
    std::lock_guard<std::mutex> lock(beat_mu_);
    if (beat_stop_) return;  // Close() came first
    beat_thread_ = std::thread([this] { Beat(); });
  }

  void StopBeating() {
    {
      std::lock_guard<std::mutex> lock(beat_mu_);
      beat_stop_ = true;
    }
    beat_cv_.notify_all();
    // (Started under beat_mu_, and not after beat_stop_: joinable() is settled here.)
    if (beat_thread_.joinable()) beat_thread_.join();
  }

  void Beat() {
    char host[256] = {};
    if (::gethostname(host, sizeof(host) - 1) != 0 || host[0] == '\0') std::strcpy(host, "?");
    const std::string path = BeatFile(rank_);
    bool made = false;
    for (std::uint64_t count = 1;; ++count) {
      const std::string text = absl::StrCat(absl::StrFormat("%020u", count), " ", ::getpid(), " ",
                                            static_cast<const char*>(host), "\n");
      {
        // Written in place: a reader that sees half of it sees a change all the same.
        // Made once: a beat never makes the file again in a directory that is being
        // removed (rank 0's Close, or whoever removes it), which would keep it from going.
        // Failures are not this thread's to report: a rank that cannot beat is judged
        // by the others, as one whose host is gone would be.
        ScopedFd fd(::open(path.c_str(), O_WRONLY | O_CLOEXEC | (made ? 0 : O_CREAT), 0644));
        if (fd.get() >= 0) {
          made |=
              ::pwrite(fd.get(), text.data(), text.size(), 0) == static_cast<ssize_t>(text.size());
        }
      }
      std::unique_lock<std::mutex> lock(beat_mu_);
      if (beat_cv_.wait_for(lock, std::chrono::microseconds(kBeatMicros),
                            [this] { return beat_stop_; })) {
        return;
      }
    }
  }

  // How long a beat must stand still before its rank is judged: the timeout, but at
  // least twice what a live rank's beat can look still for (one beat's interval plus the
  // time between two looks at that rank, which grows past 16 ranks).
  std::int64_t SilenceLimitMicros() const {
    const std::int64_t revisit =
        ((size_ - 2) / kBeatsPerLook + 1) * static_cast<std::int64_t>(kBeatLookMicros);
    // (Capped at 1e9 s, as DeadlineAfter caps timeouts: a larger value is "never".)
    const double timeout = std::min(options_.heartbeat_timeout_seconds, 1e9);
    return std::max(static_cast<std::int64_t>(timeout * 1e6), 2 * (kBeatMicros + revisit));
  }

  // Aborted naming the first rank whose beat has stood still for SilenceLimitMicros
  // while this rank watched, once found; OK otherwise. Looks every 0.25 s at most, at up
  // to kBeatsPerLook ranks in turn (an open and a read each). A rank with no beat file
  // (not beating yet, or its files gone), with a gone file, or seen at the close
  // exchange is not judged, nor any once this rank's close exchange is done. A rank not
  // looked at for half the limit (this rank did not wait on the others meanwhile, or was
  // stopped itself) is watched afresh.
  absl::Status LookForSilentRanks(std::int64_t now_micros) {
    // Once this rank's close exchange is done every rank has come to leave: none is
    // judged (rank 0 then waits for their gone files, which NFS may show late).
    if (options_.heartbeat_timeout_seconds <= 0 || size_ == 1 ||
        closed_.load(std::memory_order_acquire)) {
      return absl::OkStatus();
    }
    const std::int64_t last = last_beat_look_.load(std::memory_order_relaxed);
    if (last != 0 && now_micros - last < kBeatLookMicros) return absl::OkStatus();
    std::unique_lock<std::mutex> looking(watch_mu_, std::try_to_lock);
    if (!looking.owns_lock()) return absl::OkStatus();  // another thread is looking
    last_beat_look_.store(now_micros, std::memory_order_relaxed);
    const std::int64_t limit = SilenceLimitMicros();
    for (int i = 0; i < std::min(kBeatsPerLook, size_ - 1); ++i) {
      const int r = next_watch_;
      next_watch_ = (next_watch_ + 1) % size_;
      if (next_watch_ == rank_) next_watch_ = (next_watch_ + 1) % size_;
      if (r == rank_) continue;
      Watch& watch = watch_[r];
      if (watch.closing) continue;
      absl::StatusOr<std::string> beat = ReadFile(BeatFile(r), 512);
      // The time of this read, not of the look's start: a slow file system or a
      // preempted thread must not shorten the silence it measures.
      const std::int64_t now = NowMicros();
      if (now - watch.looked > limit / 2) watch.changed = now;  // not watched meanwhile
      watch.looked = now;
      if (!beat.ok() || beat->empty() || *beat != watch.beat) {
        watch.beat = beat.ok() ? *std::move(beat) : std::string();
        watch.changed = now;
        continue;
      }
      if (now - watch.changed < limit) continue;
      if (Exists((dir_ / absl::StrCat("gone.", r)).string())) continue;
      // A rank that said why before it went silent is reported with its reason.
      PS_RETURN_IF_ERROR(FailedMarker(/*throttled=*/false));
      // "<count> <pid> <host>\n"
      std::string who;
      const std::vector<absl::string_view> fields =
          absl::StrSplit(absl::StripTrailingAsciiWhitespace(watch.beat), ' ');
      if (fields.size() == 3) who = absl::StrCat(" (pid ", fields[1], " on ", fields[2], ")");
      return Ended(
          absl::StrCat("process ", r, who, " has shown no sign of life for ",
                       absl::StrFormat("%.1f", static_cast<double>(now - watch.changed) / 1e6),
                       " s (its heartbeat, ", QuoteForMessage(BeatFile(r), 200),
                       ", stopped: is its host down or cut off from the directory, or the process "
                       "stopped?)",
                       EarlierRunHint(BeatFile(r), "last beat")));
    }
    return absl::OkStatus();
  }

  const std::filesystem::path dir_;
  const int rank_;
  const int size_;
  const BootstrapOptions options_;
  // When this process joined, on the file system's clock (Failure).
  const std::filesystem::file_time_type started_ = std::filesystem::file_time_type::clock::now();
  std::atomic<bool> aborted_{false};
  std::mutex seq_mu_;
  std::map<std::string, std::int64_t, std::less<>> next_;
  // Point to point: messages sent by (to, channel), received by (from, channel).
  std::map<std::pair<int, std::string>, std::int64_t> sent_, received_;
  std::atomic<std::int64_t> tmp_counter_{0};
  // Failure(): when it last looked for the marker (steady clock, microseconds), and
  // whether it found one (then it always reads it).
  std::atomic<std::int64_t> last_failure_look_{0};
  std::atomic<bool> failed_seen_{false};
  // LookForEndedRanks: when it last looked, the next rank to look at (under probe_mu_),
  // and what it found (then Failure() says so).
  std::atomic<std::int64_t> last_alive_look_{0};
  std::mutex probe_mu_;
  int next_probe_ = 0;
  std::mutex ended_mu_;
  std::optional<std::string> ended_;
  // This rank's alive file, locked (HoldAliveLock) until Close() has written its gone
  // file; -1 on a file system without flock.
  ScopedFd alive_fd_;
  // The heartbeat: its thread (started with the first exchange, stopped by Close() once
  // its close exchange is done, or by the destructor), and per rank what LookForSilentRanks last
  // read (under watch_mu_).
  std::once_flag beat_started_;
  std::mutex beat_mu_;
  std::condition_variable beat_cv_;
  bool beat_stop_ = false;
  std::thread beat_thread_;
  struct Watch {
    bool closing = false;      // it has come to the close exchange: not judged
    std::string beat;          // the beat file's content when last read
    std::int64_t changed = 0;  // steady us when it was last seen to change
    std::int64_t looked = 0;   // steady us when it was last read
  };
  std::atomic<std::int64_t> last_beat_look_{0};
  std::mutex watch_mu_;
  std::vector<Watch> watch_;
  int next_watch_ = 0;
  // Entries appearing in the directory, for the waits (Events()).
  std::once_flag events_started_;
  std::unique_ptr<DirectoryEvents> events_;
  std::atomic<bool> exchanged_{false};  // an exchange has completed
  std::atomic<bool> closed_{false};     // the close exchange is done: no more exchanges
  std::atomic<bool> left_{false};       // Close() is done with the others' files
};

}  // namespace

absl::StatusOr<std::string> Broadcast(Bootstrap& bootstrap, std::string_view channel,
                                      std::string_view bytes, int root) {
  if (root < 0 || root >= bootstrap.size()) {
    return absl::InvalidArgumentError(
        absl::StrCat("broadcast root ", root, " is out of range for ", bootstrap.size(), " ranks"));
  }
  PS_ASSIGN_OR_RETURN(std::vector<std::string> all,
                      bootstrap.AllGather(channel, bootstrap.rank() == root ? bytes : ""));
  return std::move(all[root]);
}

absl::Status Barrier(Bootstrap& bootstrap, std::string_view channel) {
  return bootstrap.AllGather(channel, "").status();
}

absl::Status CheckAgreement(Bootstrap& bootstrap, std::string_view channel, std::string_view what,
                            std::string_view bytes) {
  PS_ASSIGN_OR_RETURN(const std::vector<std::string> all, bootstrap.AllGather(channel, bytes));
  for (int r = 1; r < static_cast<int>(all.size()); ++r) {
    if (all[r] == all[0]) continue;
    const bool printable = all[r].size() <= 200 && all[0].size() <= 200 &&
                           FindControlByte(all[r]) == std::string_view::npos &&
                           FindControlByte(all[0]) == std::string_view::npos;
    return absl::FailedPreconditionError(
        absl::StrCat("process ", bootstrap.job_rank(r), "'s ", Absl(what), " differs from process ",
                     bootstrap.job_rank(0), "'s",
                     printable ? absl::StrCat(" (", QuoteForMessage(all[r], 200), " against ",
                                              QuoteForMessage(all[0], 200), ")")
                               : std::string(),
                     ": start every process with the same flags"));
  }
  return absl::OkStatus();
}

absl::Status CheckSameFields(Bootstrap& bootstrap, std::string_view channel,
                             std::string_view fields, std::string_view advice) {
  PS_ASSIGN_OR_RETURN(const std::vector<std::string> all, bootstrap.AllGather(channel, fields));
  const std::vector<std::string> ours = absl::StrSplit(all[0], '\n');
  for (int q = 1; q < static_cast<int>(all.size()); ++q) {
    if (all[q] == all[0]) continue;
    const std::vector<std::string> theirs = absl::StrSplit(all[q], '\n');
    for (std::size_t i = 0; i < std::max(ours.size(), theirs.size()); ++i) {
      const std::string a = i < ours.size() ? ours[i] : "";
      const std::string b = i < theirs.size() ? theirs[i] : "";
      if (a == b) continue;
      return absl::FailedPreconditionError(
          absl::StrCat("process ", bootstrap.job_rank(q), " was started with ",
                       QuoteForMessage(b, 200), ", process ", bootstrap.job_rank(0), " with ",
                       QuoteForMessage(a, 200), ": ", Absl(advice)));
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<std::vector<std::unique_ptr<Bootstrap>>> CreateInProcessBootstraps(
    int size, const BootstrapOptions& options) {
  PS_RETURN_IF_ERROR(CheckRankAndSize(0, size));
  PS_RETURN_IF_ERROR(internal::CheckExchangeTimeout(options.timeout_seconds));
  auto group = std::make_shared<Group>(size, options);
  std::vector<std::unique_ptr<Bootstrap>> out;
  for (int r = 0; r < size; ++r) out.push_back(std::make_unique<InProcessBootstrap>(group, r));
  return out;
}

absl::StatusOr<std::unique_ptr<Bootstrap>> CreateFileBootstrap(const std::string& dir, int rank,
                                                               int size,
                                                               const BootstrapOptions& options) {
  PS_RETURN_IF_ERROR(CheckRankAndSize(rank, size));
  if (dir.empty()) {
    return absl::InvalidArgumentError("the rendezvous directory is empty: give a path");
  }
  PS_RETURN_IF_ERROR(internal::CheckExchangeTimeout(options.timeout_seconds));
  PS_RETURN_IF_ERROR(internal::CheckHeartbeatTimeout(options.heartbeat_timeout_seconds));
  auto bootstrap = std::make_unique<FileBootstrap>(dir, rank, size, options);
  PS_RETURN_IF_ERROR(bootstrap->Join());
  return std::unique_ptr<Bootstrap>(std::move(bootstrap));
}

absl::Status MarkFileBootstrapFailed(const std::string& dir, int rank, std::string_view reason) {
  const std::filesystem::path path(dir);
  if (::access((path / "job").c_str(), F_OK) != 0) return absl::OkStatus();  // no job (yet)
  // A rank that left (Close() wrote its gone file) and failed afterwards failed the job no
  // more: the others may be closing it.
  if (::access((path / absl::StrCat("gone.", rank)).c_str(), F_OK) == 0) return absl::OkStatus();
  static std::atomic<std::int64_t> counter{0};
  // The rank in the name: launchers on other hosts may have the same pid.
  const std::string tmp =
      (path / absl::StrCat(".tmp.mark.", rank, ".", ::getpid(), ".", counter++)).string();
  return LinkNewFile(tmp, (path / "failed").string(), FailureMarker(rank, reason)).status();
}

absl::StatusOr<std::unique_ptr<Bootstrap>> CreateBootstrapFromEnvironment(
    const BootstrapOptions& options) {
  const char* processes_text = std::getenv(kProcessesVariable);
  if (processes_text == nullptr) return std::unique_ptr<Bootstrap>();
  auto malformed = [](const char* name, std::string_view value, std::string_view expected) {
    return absl::InvalidArgumentError(absl::StrCat(name, "=", QuoteForMessage(value), " is not ",
                                                   Absl(expected),
                                                   " (`pipesched launch` sets it)"));
  };
  auto get = [](const char* name) -> std::optional<std::string_view> {
    const char* value = std::getenv(name);
    if (value == nullptr) return std::nullopt;
    return std::string_view(value);
  };
  // Decimal digits only, as launch's flags (abseil alone would take " 2", "+2", "0x10").
  auto digits = [](std::string_view text) {
    return !text.empty() && text.find_first_not_of("0123456789") == std::string_view::npos;
  };
  int size = 0, rank = 0;
  // At most 4096, as launch's and train's --processes.
  if (!digits(processes_text) || !absl::SimpleAtoi(processes_text, &size) || size < 1 ||
      size > 4096) {
    return malformed(kProcessesVariable, processes_text,
                     "a number of processes from 1 to 4096, in decimal digits");
  }
  const std::optional<std::string_view> rank_text = get(kProcessRankVariable);
  if (!rank_text.has_value()) {
    return absl::InvalidArgumentError(
        absl::StrCat(kProcessesVariable, " is set but ", kProcessRankVariable,
                     " is not: a process of a job needs both (`pipesched launch` sets them)"));
  }
  if (!digits(*rank_text) || !absl::SimpleAtoi(Absl(*rank_text), &rank) || rank < 0 ||
      rank >= size) {
    return malformed(
        kProcessRankVariable, *rank_text,
        absl::StrCat("a rank from 0 to ", size - 1, " (", kProcessesVariable, "=", size, ")"));
  }
  const std::optional<std::string_view> dir = get(kRendezvousVariable);
  if (!dir.has_value() || dir->empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat(kProcessesVariable, " is set but ", kRendezvousVariable,
                     " is not: the processes meet in that directory (`pipesched launch` sets "
                     "it)"));
  }
  BootstrapOptions resolved = options;
  if (const std::optional<std::string_view> timeout = get(kRendezvousTimeoutVariable);
      timeout.has_value()) {
    double seconds = 0;
    // At least a second, as launch's and train's --rendezvous-timeout: 0 would wait for
    // ever for a process that never comes.
    // Unsigned, as launch writes it.
    if (!IsDecimalNumber(*timeout) || (*timeout)[0] == '+' || (*timeout)[0] == '-' ||
        !absl::SimpleAtod(Absl(*timeout), &seconds) || !std::isfinite(seconds) || seconds < 1) {
      return malformed(kRendezvousTimeoutVariable, *timeout,
                       "a number of seconds, 1 or more, in decimal");
    }
    resolved.timeout_seconds = seconds;
  }
  return CreateFileBootstrap(std::string(*dir), rank, size, resolved);
}

}  // namespace pipesched::comm
