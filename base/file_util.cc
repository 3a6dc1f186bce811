#include "base/file_util.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <limits>
#include <system_error>

#include "absl/strings/str_cat.h"
#include "base/host_memory.h"
#include "base/strings.h"

namespace pipesched {
namespace {

absl::Status ErrnoStatus(int err, std::string_view what, const std::string& path) {
  std::string msg = absl::StrCat(Absl(what), " '", path, "': ", std::strerror(err));
  if (err == ENOENT) return absl::NotFoundError(msg);
  if (err == EACCES || err == EPERM) return absl::PermissionDeniedError(msg);
  if (err == EISDIR) return absl::InvalidArgumentError(msg);
  return absl::InternalError(msg);
}

}  // namespace

absl::Status CheckOutputPath(std::string_view flag, const std::string& path) {
  namespace fs = std::filesystem;
  auto bad = [&](const std::string& what) {
    return absl::InvalidArgumentError(absl::StrCat(Absl(flag), "=", path, ": ", what,
                                                   "; give a file path in a writable directory"));
  };
  std::error_code ec;
  if (fs::is_directory(path, ec)) return bad("is a directory");
  const fs::path parent = fs::path(path).parent_path();
  const fs::path dir = parent.empty() ? fs::path(".") : parent;
  if (!fs::exists(dir, ec))
    return bad(absl::StrCat("the directory ", dir.string(), " does not exist"));
  if (!fs::is_directory(dir, ec)) return bad(absl::StrCat(dir.string(), " is not a directory"));
  if (::access(dir.c_str(), W_OK | X_OK) != 0) {
    return bad(absl::StrCat("the directory ", dir.string(), " is not writable (",
                            std::strerror(errno), ")"));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::string> ReadFile(const std::string& path, std::int64_t max_bytes,
                                     std::string_view limit) {
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return ErrnoStatus(errno, "cannot open", path);
  auto too_big = [&](std::string_view what) {
    ::close(fd);
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
      int err = errno;
      ::close(fd);
      return ErrnoStatus(err, "cannot read", path);
    }
    if (n == 0) break;
    if (static_cast<std::int64_t>(out.size()) + n > max_bytes) return too_big("it goes on");
    out.append(buf, static_cast<size_t>(n));
  }
  ::close(fd);
  return out;
}

std::int64_t HostLoadLimitBytes() {
  // Half: the file's bytes and what they are parsed into are both held for a while.
  return HostMemoryAvailableBytes().value_or(std::numeric_limits<std::int64_t>::max() / 2) / 2;
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

absl::Status WriteFileAtomic(const std::string& path, std::string_view content) {
  // An existing path that is not a regular file (/dev/stdout, /dev/null, a pipe) is
  // written into as it is: renaming a file onto it would replace the device or pipe.
  struct stat st {};
  if (::stat(path.c_str(), &st) == 0 && !S_ISREG(st.st_mode) && !S_ISDIR(st.st_mode)) {
    int fd = ::open(path.c_str(), O_WRONLY | O_CLOEXEC);
    if (fd < 0) return ErrnoStatus(errno, "cannot open", path);
    const int err = WriteAll(fd, content);
    if (::close(fd) != 0 && err == 0) return ErrnoStatus(errno, "cannot write", path);
    if (err != 0) return ErrnoStatus(err, "cannot write", path);
    return absl::OkStatus();
  }
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

}  // namespace pipesched
