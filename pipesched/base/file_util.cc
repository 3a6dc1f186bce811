#include "pipesched/base/file_util.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <condition_variable>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <iostream>
#include <limits>
#include <memory>
#include <mutex>
#include <new>
#include <string>
#include <system_error>
#include <thread>
#include <utility>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "pipesched/base/host_memory.h"
#include "pipesched/base/status.h"
#include "pipesched/base/strings.h"

namespace pipesched {

absl::Status ErrnoStatus(int err, std::string_view what, const std::string& path) {
  std::string msg = absl::StrCat(Absl(what), " '", path, "': ", std::strerror(err));
  if (err == ENOENT) return absl::NotFoundError(msg);
  if (err == EACCES || err == EPERM) return absl::PermissionDeniedError(msg);
  // The path itself is at fault: a directory, a loop of links, a name too long.
  if (err == EISDIR || err == ELOOP || err == ENAMETOOLONG || err == ENOTDIR) {
    return absl::InvalidArgumentError(msg);
  }
  return absl::InternalError(msg);
}

namespace {

// Where a write to an output path goes.
struct OutputTarget {
  enum Kind {
    kReplace,     // a regular file or a new name: replaced atomically (temporary + rename)
    kInPlace,     // an existing device or pipe (/dev/null, a FIFO): written into as it is
    kDescriptor,  // a link into this process's open files (/dev/stdout, /dev/fd/3)
  } kind = kReplace;
  std::string path;  // kReplace: the final target, links followed (the links stay)
  int fd = -1;       // kDescriptor
};

// Follows symbolic links, at most 16. Renaming onto a link would replace the link (as
// root, /dev/stdout itself), and reopening /dev/stdout when it is redirected to a file
// would write from offset 0 over what the process printed before: such a link is written
// through its descriptor, at its current position.
OutputTarget ResolveOutput(const std::string& path) {
  namespace fs = std::filesystem;
  const fs::path own_fds = fs::path("/proc") / std::to_string(::getpid()) / "fd";
  std::string p = path;
  for (int hop = 0; hop < 16; ++hop) {
    const fs::path parent =
        fs::path(p).parent_path().empty() ? fs::path(".") : fs::path(p).parent_path();
    // A name in this process's descriptor directory is a descriptor, open or not (/dev/fd/9
    // with no descriptor 9 is not a new file to create).
    std::error_code ec;
    int fd = -1;
    if (fs::canonical(parent, ec) == own_fds && !ec &&
        absl::SimpleAtoi(fs::path(p).filename().string(), &fd)) {
      return {.kind = OutputTarget::kDescriptor, .path = p, .fd = fd};
    }
    struct stat st {};
    if (::lstat(p.c_str(), &st) != 0) return {.kind = OutputTarget::kReplace, .path = p};
    if (!S_ISLNK(st.st_mode)) {
      const bool replace = S_ISREG(st.st_mode) || S_ISDIR(st.st_mode);
      return {.kind = replace ? OutputTarget::kReplace : OutputTarget::kInPlace, .path = p};
    }
    char target[4096];
    const ssize_t n = ::readlink(p.c_str(), target, sizeof(target) - 1);
    if (n < 0) break;
    const fs::path next(std::string(target, static_cast<std::size_t>(n)));
    p = next.is_absolute() ? next.string() : (parent / next).string();
  }
  return {.kind = OutputTarget::kInPlace, .path = path};  // open() names the loop
}

}  // namespace

absl::Status CheckOutputPath(std::string_view flag, const std::string& path) {
  namespace fs = std::filesystem;
  auto bad = [&](const std::string& what) {
    return absl::InvalidArgumentError(absl::StrCat(Absl(flag), "=", path, ": ", what,
                                                   "; give a file path in a writable directory"));
  };
  // "--json= " (a stray space after '='): a file named by blanks is a typo, not a choice.
  if (!path.empty() && path.find_first_not_of(" \t") == std::string::npos) {
    return absl::InvalidArgumentError(absl::StrCat(
        Absl(flag), "='", path, "' is only blanks; give a file path, or leave the flag out"));
  }
  const OutputTarget target = ResolveOutput(path);
  if (target.kind == OutputTarget::kDescriptor) {
    const int flags = ::fcntl(target.fd, F_GETFL);
    if (flags < 0 || (flags & O_ACCMODE) == O_RDONLY) {
      return bad(absl::StrCat("descriptor ", target.fd, " is not open for writing"));
    }
    return absl::OkStatus();
  }
  if (target.kind == OutputTarget::kInPlace) {
    if (::access(target.path.c_str(), W_OK) != 0) {
      return bad(absl::StrCat("is not writable (", std::strerror(errno), ")"));
    }
    return absl::OkStatus();
  }
  std::error_code ec;
  if (fs::is_directory(target.path, ec)) return bad("is a directory");
  const fs::path parent = fs::path(target.path).parent_path();
  const fs::path dir = parent.empty() ? fs::path(".") : parent;
  if (!fs::exists(dir, ec))
    return bad(absl::StrCat("the directory ", dir.string(), " does not exist"));
  if (!fs::is_directory(dir, ec)) return bad(absl::StrCat(dir.string(), " is not a directory"));
  if (::access(dir.c_str(), W_OK | X_OK) != 0) {
    return bad(absl::StrCat("the directory ", dir.string(), " is not writable (",
                            std::strerror(errno), ")"));
  }
  // access() says yes to root everywhere, and to anyone on a read-only file system's
  // directories or in /proc and /sys: create the temporary the write will use, and drop it.
  const std::string probe = absl::StrCat(target.path, ".tmp.", ::getpid());
  const int fd = ::open(probe.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
  if (fd >= 0) {
    ::close(fd);
    ::unlink(probe.c_str());
  } else if (errno != EEXIST) {
    return bad(absl::StrCat("the directory ", dir.string(), " takes no new file (",
                            std::strerror(errno), ")"));
  }
  return absl::OkStatus();
}

absl::Status CheckFilesDistinct(const std::vector<FlagPath>& inputs,
                                const std::vector<FlagPath>& outputs) {
  namespace fs = std::filesystem;
  std::vector<std::pair<const FlagPath*, fs::path>> written;  // regular files, resolved
  for (const FlagPath& out : outputs) {
    if (out.path.empty()) continue;
    const OutputTarget target = ResolveOutput(out.path);
    if (target.kind != OutputTarget::kReplace) continue;
    std::error_code ec;
    for (const FlagPath& in : inputs) {
      if (!in.path.empty() && fs::equivalent(target.path, in.path, ec) && !ec) {
        return absl::InvalidArgumentError(absl::StrCat(
            Absl(out.flag), "=", out.path, " is also ", Absl(in.flag),
            ": writing it would replace that input; give ", Absl(out.flag), " another path"));
      }
    }
    const fs::path resolved = fs::weakly_canonical(fs::absolute(target.path, ec), ec);
    for (const auto& [earlier, path] : written) {
      if (path == resolved) {
        return absl::InvalidArgumentError(
            absl::StrCat(Absl(out.flag), "=", out.path, " is also ", Absl(earlier->flag),
                         ": one would overwrite the other; give each its own path"));
      }
    }
    written.emplace_back(&out, resolved);
  }
  return absl::OkStatus();
}

ScopedFd& ScopedFd::operator=(ScopedFd&& other) noexcept {
  if (this != &other) {
    if (fd_ >= 0) ::close(fd_);
    fd_ = other.release();
  }
  return *this;
}

ScopedFd::~ScopedFd() {
  if (fd_ >= 0) ::close(fd_);
}

int ScopedFd::release() { return std::exchange(fd_, -1); }

namespace {

int OpenRetryingOnSignals(const std::string& path, int flags) {
  int fd;
  do {
    fd = ::open(path.c_str(), flags | O_CLOEXEC);
  } while (fd < 0 && errno == EINTR);
  return fd;
}

// A FIFO's open() blocks until its other end is opened, perhaps for ever. It runs on a
// helper thread; after `wait`, this thread opens the other end itself, without blocking
// (the blocked open counts as that end's partner), which releases the helper, and
// reports the timeout. `flags` is O_RDONLY or O_WRONLY.
absl::StatusOr<ScopedFd> OpenFifo(const std::string& path, int flags,
                                  std::chrono::milliseconds wait, const std::string& shown) {
  struct Pending {
    std::mutex mu;
    std::condition_variable done_cv;
    bool done = false;
    bool abandoned = false;  // nobody will take the descriptor: the helper closes it
    int fd = -1;
    int err = 0;
  };
  auto pending = std::make_shared<Pending>();
  std::thread opener;
  try {
    opener = std::thread([pending, path, flags] {
      const int fd = OpenRetryingOnSignals(path, flags);
      const int err = errno;
      std::lock_guard<std::mutex> lock(pending->mu);
      pending->done = true;
      pending->fd = fd;
      pending->err = err;
      if (pending->abandoned && fd >= 0) ::close(fd);
      pending->done_cv.notify_all();
    });
  } catch (const std::system_error& e) {  // no thread to be had (ulimit -u)
    return absl::ResourceExhaustedError(absl::StrCat(
        "cannot open the FIFO '", shown, "': no thread to wait for its other end with (", e.what(),
        "); give a regular file"));
  }
  std::unique_lock<std::mutex> lock(pending->mu);
  if (pending->done_cv.wait_for(lock, wait, [&] { return pending->done; })) {
    lock.unlock();
    opener.join();
    if (pending->fd < 0) return ErrnoStatus(pending->err, "cannot open", shown);
    return ScopedFd(pending->fd);
  }
  const int release_flags = (flags == O_RDONLY ? O_WRONLY : O_RDONLY) | O_NONBLOCK;
  ScopedFd release(OpenRetryingOnSignals(path, release_flags));
  if (release.get() < 0) {
    // The other end cannot be opened from here (its permissions, or the FIFO is gone):
    // the helper stays blocked until someone opens it, and closes what it gets.
    pending->abandoned = true;
    lock.unlock();
    opener.detach();
  } else {
    lock.unlock();
    opener.join();
    if (pending->fd >= 0) ::close(pending->fd);
  }
  const bool reading = flags == O_RDONLY;
  return absl::UnavailableError(absl::StrCat(
      "cannot ", reading ? "read '" : "write '", shown, "': no process opened this FIFO for ",
      reading ? "writing" : "reading", " within ", static_cast<double>(wait.count()) / 1000, " s; ",
      reading ? absl::StrCat("write into it (cat file > ", shown, ")")
              : absl::StrCat("read from it (cat ", shown, ")"),
      " or give a regular file"));
}

// Whether `path` leads, through symbolic links, to an anonymous pipe (a shell's <(...),
// /dev/stdin in a pipeline: /proc/self/fd/N -> "pipe:[123]"), whose open never blocks.
bool IsAnonymousPipe(std::string path) {
  for (int hop = 0; hop < 16; ++hop) {
    char target[4096];
    const ssize_t n = ::readlink(path.c_str(), target, sizeof(target) - 1);
    if (n < 0) return false;
    const std::string next(target, static_cast<std::size_t>(n));
    if (next.empty()) return false;
    if (next.rfind("pipe:", 0) == 0) return true;
    if (next.front() == '/') {
      path = next;
    } else {
      const std::size_t slash = path.rfind('/');
      path = slash == std::string::npos ? next : path.substr(0, slash + 1) + next;
    }
  }
  return false;
}

// `shown` is the path as the user gave it, for messages.
absl::StatusOr<ScopedFd> OpenWaiting(const std::string& path, int flags,
                                     std::chrono::milliseconds wait, const std::string& shown) {
  struct stat st {};
  if (::stat(path.c_str(), &st) == 0 && S_ISFIFO(st.st_mode) && !IsAnonymousPipe(path)) {
    return OpenFifo(path, flags, wait, shown);
  }
  ScopedFd fd(OpenRetryingOnSignals(path, flags));
  if (fd.get() < 0) return ErrnoStatus(errno, "cannot open", shown);
  return fd;
}

}  // namespace

absl::StatusOr<ScopedFd> OpenForReading(const std::string& path,
                                        std::chrono::milliseconds fifo_wait) {
  return OpenWaiting(path, O_RDONLY, fifo_wait, path);
}

absl::StatusOr<ScopedFd> OpenForWriting(const std::string& path,
                                        std::chrono::milliseconds fifo_wait) {
  return OpenWaiting(path, O_WRONLY, fifo_wait, path);
}

absl::StatusOr<std::string> ReadFile(const std::string& path, std::int64_t max_bytes,
                                     std::string_view limit) {
  PS_ASSIGN_OR_RETURN(ScopedFd file, OpenForReading(path));
  const int fd = file.get();
  auto too_big = [&](std::string_view what) {
    return absl::InvalidArgumentError(
        absl::StrCat("cannot read '", path, "': ", Absl(what), ", more than ",
                     limit.empty() ? "the limit" : Absl(limit), " (", HumanBytes(max_bytes),
                     "); give a smaller file"));
  };
  struct stat st {};
  if (::fstat(fd, &st) == 0 && S_ISREG(st.st_mode) && st.st_size > max_bytes) {
    return too_big(absl::StrCat("it holds ", HumanBytes(st.st_size)));
  }
  // Anything else (a pipe, a device) is read up to the limit: /dev/zero never ends.
  std::string out;
  char buf[1 << 16];
  while (true) {
    ssize_t n = ::read(fd, buf, sizeof(buf));
    if (n < 0) {
      if (errno == EINTR) continue;
      return ErrnoStatus(errno, "cannot read", path);
    }
    if (n == 0) break;
    if (static_cast<std::int64_t>(out.size()) + n > max_bytes) return too_big("it goes on");
    // The limit follows the machine's memory; a process limit (ulimit -v, a container's)
    // can be lower, and then growing the string throws.
    try {
      out.append(buf, static_cast<size_t>(n));
    } catch (const std::bad_alloc&) {
      const std::size_t read = out.size();
      out = std::string();
      return absl::ResourceExhaustedError(
          absl::StrCat("cannot read '", path, "': out of memory after ", HumanBytes(read),
                       " (this process may hold less than the machine has: see ulimit -v); give a "
                       "smaller file or raise the process's memory limit"));
    }
  }
  return out;
}

absl::StatusOr<std::string> ReadFileToLoad(const std::string& path) {
  const std::int64_t limit =
      HostMemoryAvailableBytes().value_or(std::numeric_limits<std::int64_t>::max() / 2) / 2;
  return ReadFile(path, limit, "half the host memory available");
}

namespace {

// Writes all of `content` to `fd`; the errno of a failed write, else 0.
int WriteAll(int fd, std::string_view content) {
  size_t done = 0;
  while (done < content.size()) {
    ssize_t n = ::write(fd, content.data() + done, content.size() - done);
    if (n < 0) {
      if (errno == EINTR) continue;
      return errno;
    }
    done += static_cast<size_t>(n);
  }
  return 0;
}

}  // namespace

absl::Status WriteFileAtomic(const std::string& requested, std::string_view content) {
  const OutputTarget target = ResolveOutput(requested);
  if (target.kind == OutputTarget::kDescriptor) {
    // What the program printed through the standard streams comes first.
    if (target.fd == STDOUT_FILENO) std::cout.flush();
    if (target.fd == STDERR_FILENO) std::cerr.flush();
    if (const int err = WriteAll(target.fd, content); err != 0) {
      return ErrnoStatus(err, "cannot write", requested);
    }
    return absl::OkStatus();
  }
  if (target.kind == OutputTarget::kInPlace) {
    PS_ASSIGN_OR_RETURN(ScopedFd opened,
                        OpenWaiting(target.path, O_WRONLY, kFifoPartnerWait, requested));
    const int fd = opened.release();
    const int err = WriteAll(fd, content);
    if (::close(fd) != 0 && err == 0) return ErrnoStatus(errno, "cannot write", requested);
    if (err != 0) return ErrnoStatus(err, "cannot write", requested);
    return absl::OkStatus();
  }
  const std::string& path = target.path;
  std::string tmp = absl::StrCat(path, ".tmp.", ::getpid());
  int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) return ErrnoStatus(errno, "cannot create", tmp);
  if (const int err = WriteAll(fd, content); err != 0) {
    ::close(fd);
    ::unlink(tmp.c_str());
    return ErrnoStatus(err, "cannot write", tmp);
  }
  if (::fsync(fd) != 0) {
    int err = errno;
    ::close(fd);
    ::unlink(tmp.c_str());
    return ErrnoStatus(err, "cannot fsync", tmp);
  }
  if (::close(fd) != 0) {
    int err = errno;
    ::unlink(tmp.c_str());
    return ErrnoStatus(err, "cannot write", tmp);
  }
  if (::rename(tmp.c_str(), path.c_str()) != 0) {
    int err = errno;
    ::unlink(tmp.c_str());
    return ErrnoStatus(err, "cannot rename onto", path);
  }
  // Make the rename itself durable: fsync the directory that holds `path` (best effort:
  // some file systems refuse to open or fsync a directory).
  const std::size_t slash = path.rfind('/');
  const std::string dir =
      slash == std::string::npos ? "." : (slash == 0 ? "/" : path.substr(0, slash));
  if (int dir_fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC); dir_fd >= 0) {
    (void)::fsync(dir_fd);
    ::close(dir_fd);
  }
  return absl::OkStatus();
}

absl::Status CheckOutputs(const std::vector<FlagPath>& inputs,
                          const std::vector<FlagPath>& outputs) {
  for (const FlagPath& output : outputs) {
    if (!output.path.empty()) PS_RETURN_IF_ERROR(CheckOutputPath(output.flag, output.path));
  }
  return CheckFilesDistinct(inputs, outputs);
}

}  // namespace pipesched
