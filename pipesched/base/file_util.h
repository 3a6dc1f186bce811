// Whole-file reads and atomic writes. Errors name the path and the OS reason.
#pragma once

#include <chrono>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace pipesched {

// What ReadFile reads at most unless told otherwise: far beyond any schedule or cost
// file, and a bound on what a device such as /dev/zero can make it take.
inline constexpr std::int64_t kReadFileDefaultMaxBytes = std::int64_t{1} << 30;

// A file descriptor that closes itself. Move-only; -1 holds nothing.
class ScopedFd {
 public:
  ScopedFd() = default;
  explicit ScopedFd(int fd) : fd_(fd) {}
  ScopedFd(ScopedFd&& other) noexcept : fd_(other.release()) {}
  ScopedFd& operator=(ScopedFd&& other) noexcept;
  ScopedFd(const ScopedFd&) = delete;
  ScopedFd& operator=(const ScopedFd&) = delete;
  ~ScopedFd();

  int get() const { return fd_; }
  int release();

 private:
  int fd_ = -1;
};

// How long opening a named pipe (FIFO) waits for its other end: opening one blocks until
// a process opens it the other way, which may never happen.
inline constexpr std::chrono::milliseconds kFifoPartnerWait{30000};

// Opens `path` for reading (ErrnoStatus on failure). A FIFO waits at most `fifo_wait` for
// a writer to open it, then fails with Unavailable "cannot read 'f': no process
// opened this FIFO for writing within 30 s; write into it (cat schedule.json > f) or
// give a regular file" instead of blocking for ever. Once a writer is there, reads wait
// for its data as long as it takes (a slow producer is not an error). A pipe from the
// shell (<(...), /dev/stdin) never waits here: its writer exists.
absl::StatusOr<ScopedFd> OpenForReading(const std::string& path,
                                        std::chrono::milliseconds fifo_wait = kFifoPartnerWait);

// Opens an existing `path` for writing in place (a device, a FIFO): O_WRONLY, no create,
// no truncate. A FIFO waits at most `fifo_wait` for a reader, then Unavailable
// "cannot write 'f': no process opened this FIFO for reading within 30 s; read from it
// (cat f) or give a regular file". Writing into a FIFO whose reader went away raises
// SIGPIPE, as for any program writing into a pipe.
absl::StatusOr<ScopedFd> OpenForWriting(const std::string& path,
                                        std::chrono::milliseconds fifo_wait = kFifoPartnerWait);

// Reads the whole file (opened by OpenForReading). NotFound / PermissionDenied / Internal with the
// path and strerror; InvalidArgument when it holds more than `max_bytes` (a regular file is refused
// by its size, before anything is read), naming the limit: "more than <limit> (1.00 GiB)".
absl::StatusOr<std::string> ReadFile(const std::string& path,
                                     std::int64_t max_bytes = kReadFileDefaultMaxBytes,
                                     std::string_view limit = "");

// Reads a file that is loaded whole into host memory (a data set, parameters, a
// checkpoint): ReadFile limited to half the memory available now, "more than half the
// host memory available (N GiB)" (its bytes and what they are parsed into are both held
// for a while); no limit where MemAvailable is unknown.
absl::StatusOr<std::string> ReadFileToLoad(const std::string& path);

// Writes `content` to `path` atomically: a temporary file beside it, fsync, rename.
// A failed write leaves any previous file at `path` untouched. Symbolic links are
// followed (the file they lead to is replaced; the links stay). A link into this
// process's open files (/dev/stdout, /dev/fd/3) is written through that descriptor, at
// its position; an existing path that is neither a regular file nor a directory
// (/dev/null, a pipe) is written into as it is (OpenForWriting: a FIFO without a reader
// is Unavailable after kFifoPartnerWait). NotFound (no such directory),
// PermissionDenied, InvalidArgument (`path` is a directory) or Internal, with the path
// and strerror (ENOSPC: "No space left on device").
absl::Status WriteFileAtomic(const std::string& path, std::string_view content);

// "<what> '<path>': <strerror(err)>" as the status its errno means: NotFound (ENOENT),
// PermissionDenied (EACCES, EPERM), InvalidArgument when the path itself is at fault
// (EISDIR, ELOOP, ENAMETOOLONG, ENOTDIR), Internal otherwise.
absl::Status ErrnoStatus(int err, std::string_view what, const std::string& path);

// Whether WriteFileAtomic(path, ...) can succeed, checked before a long run that writes
// it at the end: the directory exists and is writable, and `path` is not a directory;
// for a device or pipe, that it is writable; for /dev/stdout and the like, that the
// descriptor is open for writing.
// InvalidArgument "<flag>=<path>: <what is wrong>; <what would work>" otherwise (`flag`
// as the user typed it, e.g. "--csv").
absl::Status CheckOutputPath(std::string_view flag, const std::string& path);

// A named path: the flag as the user typed it ("--json", "FILE") and its value.
struct FlagPath {
  std::string_view flag;
  std::string path;
};

// Checked before a run that reads `inputs` and writes `outputs` (empty paths are
// skipped): no output is the same file as an input (it would be replaced by what the
// run writes) or as another output (one would overwrite the other). Devices, pipes and
// descriptors (/dev/stdout) may repeat. InvalidArgument "--save=d.st is also --data:
// ...; give --save another path" otherwise.
absl::Status CheckFilesDistinct(const std::vector<FlagPath>& inputs,
                                const std::vector<FlagPath>& outputs);

// Both checks before a run: CheckOutputPath for each non-empty output, then
// CheckFilesDistinct.
absl::Status CheckOutputs(const std::vector<FlagPath>& inputs,
                          const std::vector<FlagPath>& outputs);

}  // namespace pipesched
