#include "pipesched/base/file_util.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <iterator>
#include <optional>
#include <string>
#include <thread>

#include "gtest/gtest.h"
#include "testing/capped_child.h"
#include "testing/status_matchers.h"

namespace pipesched {
namespace {

using ::pipesched::testing::StatusIs;
using ::testing::HasSubstr;

std::string TempPath(const std::string& name) {
  const char* dir = std::getenv("TMPDIR");
  return std::string(dir ? dir : "/tmp") + "/pipesched_file_util_" + name;
}

// A new FIFO at `path` (whatever was there removed); false with errno set otherwise.
bool MakeFifo(const std::string& path) {
  ::unlink(path.c_str());
  return ::mkfifo(path.c_str(), 0600) == 0;
}

TEST(FileUtilTest, WriteThenReadRoundTrips) {
  std::string path = TempPath("roundtrip");
  std::string content("a\0b\nc", 5);
  PS_ASSERT_OK(WriteFileAtomic(path, content));
  PS_ASSERT_OK_AND_ASSIGN(std::string back, ReadFile(path));
  EXPECT_EQ(back, content);
}

TEST(FileUtilTest, MissingFileIsNotFoundNamingThePath) {
  EXPECT_THAT(ReadFile("/nonexistent/dir/x.csv"),
              StatusIs(absl::StatusCode::kNotFound, HasSubstr("/nonexistent/dir/x.csv")));
}

TEST(FileUtilTest, FailedWriteKeepsPreviousFile) {
  std::string path = TempPath("keep");
  PS_ASSERT_OK(WriteFileAtomic(path, "old"));
  // A directory that does not exist makes the temporary file fail; `path` is untouched.
  EXPECT_FALSE(WriteFileAtomic("/nonexistent/dir/file", "new").ok());
  PS_ASSERT_OK_AND_ASSIGN(std::string back, ReadFile(path));
  EXPECT_EQ(back, "old");
}

// The limit follows the machine's memory, but the process may have less (ulimit -v, a
// container): reading a never-ending device then runs out before the limit, and that is
// ResourceExhausted naming the file, not an exception out of the program. In a child
// process whose address space is capped 64 MiB above its current size.
TEST(FileUtilTest, ReadFileBeyondTheProcessMemoryLimitIsResourceExhausted) {
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
  GTEST_SKIP() << "the sanitizers' runtimes need more address space than the cap leaves";
#else
  const std::optional<int> code = testing::RunWithCappedAddressSpace(std::size_t{64} << 20, [] {
    absl::StatusOr<std::string> read = ReadFile("/dev/zero", std::int64_t{1} << 40);
    if (read.ok()) return 5;
    const std::string message(read.status().message());
    const bool right = absl::IsResourceExhausted(read.status()) &&
                       message.find("cannot read '/dev/zero': out of memory after ") == 0 &&
                       message.find("raise the process's memory limit") != std::string::npos;
    return right ? 0 : 6;
  });
  ASSERT_TRUE(code.has_value()) << "the child did not exit";
  EXPECT_EQ(*code, 0) << "3/4: setup failed, 5: read 1 TiB, 6: another error than expected";
#endif
}

// What a long run checks before it starts, so that it does not fail at the end.
TEST(FileUtilTest, ReadFileStopsAtItsLimit) {
  // A device that never ends is refused once past the limit, not read until memory runs out.
  EXPECT_THAT(ReadFile("/dev/zero", 1 << 20),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("cannot read '/dev/zero': it goes on, more than the limit "
                                 "(1.00 MiB); give a smaller file")));
  // A regular file is refused by its size, with the limit's name.
  const std::string path = TempPath("big");
  PS_ASSERT_OK(WriteFileAtomic(path, std::string(3000, 'x')));
  EXPECT_THAT(ReadFile(path, 2048, "what a test allows"),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("it holds 2.9 KiB, more than what a test allows (2.0 KiB)")));
  PS_ASSERT_OK_AND_ASSIGN(std::string exact, ReadFile(path, 3000));
  EXPECT_EQ(exact.size(), 3000u);
}

// Writing to a path that is a pipe (or /dev/stdout) writes into it: a rename onto it would
// replace it with a regular file (which, run as root with --json=/dev/null, would have
// replaced /dev/null).
TEST(FileUtilTest, WriteIntoAPipeKeepsThePipe) {
  const std::string path = TempPath("fifo");
  ASSERT_TRUE(MakeFifo(path)) << std::strerror(errno);
  std::string received;
  std::thread reader([&] {
    std::ifstream in(path, std::ios::binary);
    received.assign(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
  });
  PS_EXPECT_OK(WriteFileAtomic(path, "through the pipe"));
  reader.join();
  EXPECT_EQ(received, "through the pipe");
  struct stat st {};
  ASSERT_EQ(::stat(path.c_str(), &st), 0);
  EXPECT_TRUE(S_ISFIFO(st.st_mode));
  ::unlink(path.c_str());
}

// A FIFO that nobody opens for writing would block open() for ever: reading it gives up
// after the wait with a message that says what to do, and leaves no thread behind
// blocked (the next open of the same FIFO works at once).
TEST(FileUtilTest, ReadingAFifoWithoutAWriterTimesOutNamingIt) {
  const std::string path = TempPath("fifo_no_writer");
  ASSERT_TRUE(MakeFifo(path)) << std::strerror(errno);
  EXPECT_THAT(OpenForReading(path, std::chrono::milliseconds(100)),
              StatusIs(absl::StatusCode::kUnavailable,
                       "cannot read '" + path +
                           "': no process opened this FIFO for writing within 0.1 s; write "
                           "into it (cat file > " +
                           path + ") or give a regular file"));
  std::thread writer([&] {
    std::ofstream out(path, std::ios::binary);
    out << "late but there";
  });
  PS_ASSERT_OK_AND_ASSIGN(ScopedFd fd, OpenForReading(path, std::chrono::seconds(20)));
  char buf[64];
  std::string got;
  for (ssize_t n; (n = ::read(fd.get(), buf, sizeof(buf))) > 0;) got.append(buf, n);
  writer.join();
  EXPECT_EQ(got, "late but there");
  ::unlink(path.c_str());
}

// A writer that opens the FIFO and then takes its time is waited for: only a FIFO that
// nobody opens is an error.
TEST(FileUtilTest, ReadFileWaitsForASlowWriterOfAFifo) {
  const std::string path = TempPath("fifo_slow_writer");
  ASSERT_TRUE(MakeFifo(path)) << std::strerror(errno);
  std::thread writer([&] {
    std::ofstream out(path, std::ios::binary);
    std::this_thread::sleep_for(std::chrono::milliseconds(300));
    out << "{\"slow\": true}";
  });
  PS_ASSERT_OK_AND_ASSIGN(std::string got, ReadFile(path));
  writer.join();
  EXPECT_EQ(got, "{\"slow\": true}");
  ::unlink(path.c_str());
}

// A shell's pipe (<(...), /dev/stdin in a pipeline) is /proc/self/fd/N -> "pipe:[...]":
// its writer exists, so it is read as it is, with no wait for one.
TEST(FileUtilTest, AnonymousPipesAreReadThroughTheirDescriptorLink) {
  int fds[2];
  ASSERT_EQ(::pipe(fds), 0) << std::strerror(errno);
  const std::string link = "/proc/self/fd/" + std::to_string(fds[0]);
  std::thread writer([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
    const std::string text = "1F0,1B0\n";
    EXPECT_EQ(::write(fds[1], text.data(), text.size()), static_cast<ssize_t>(text.size()));
    ::close(fds[1]);
  });
  PS_ASSERT_OK_AND_ASSIGN(std::string got, ReadFile(link));
  writer.join();
  EXPECT_EQ(got, "1F0,1B0\n");
  ::close(fds[0]);
}

TEST(FileUtilTest, WritingAFifoWithoutAReaderTimesOutNamingIt) {
  const std::string path = TempPath("fifo_no_reader");
  ASSERT_TRUE(MakeFifo(path)) << std::strerror(errno);
  EXPECT_THAT(OpenForWriting(path, std::chrono::milliseconds(250)),
              StatusIs(absl::StatusCode::kUnavailable,
                       "cannot write '" + path +
                           "': no process opened this FIFO for reading within 0.25 s; read "
                           "from it (cat " +
                           path + ") or give a regular file"));
  // Nothing is left holding the FIFO: a reader that comes now sees no writer and no data.
  const int reader = ::open(path.c_str(), O_RDONLY | O_NONBLOCK);
  ASSERT_GE(reader, 0) << std::strerror(errno);
  char c;
  EXPECT_EQ(::read(reader, &c, 1), 0);
  ::close(reader);
  ::unlink(path.c_str());
}

TEST(FileUtilTest, OpenForReadingARegularFileAndAMissingOne) {
  const std::string path = TempPath("plain");
  PS_ASSERT_OK(WriteFileAtomic(path, "abc"));
  PS_ASSERT_OK_AND_ASSIGN(ScopedFd fd, OpenForReading(path, std::chrono::milliseconds(1)));
  char buf[8];
  EXPECT_EQ(::read(fd.get(), buf, sizeof(buf)), 3);
  ScopedFd moved = std::move(fd);
  EXPECT_EQ(fd.get(), -1);
  EXPECT_GE(moved.get(), 0);
  EXPECT_THAT(OpenForReading(TempPath("missing/x"), std::chrono::milliseconds(1)),
              StatusIs(absl::StatusCode::kNotFound, HasSubstr("cannot open '")));
  ::unlink(path.c_str());
}

// /dev/stdout redirected to a file is /proc/self/fd/1, a link to that file: the write
// goes through the descriptor, after what was written to it before (reopening the path
// would start at offset 0; renaming onto it would replace the link).
TEST(FileUtilTest, WriteThroughAnOpenDescriptorAppendsAtItsPosition) {
  const std::string path = TempPath("descriptor");
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  ASSERT_GE(fd, 0) << std::strerror(errno);
  ASSERT_EQ(::write(fd, "printed before\n", 15), 15);
  const std::string via = "/dev/fd/" + std::to_string(fd);
  PS_EXPECT_OK(CheckOutputPath("--json", via));
  PS_EXPECT_OK(WriteFileAtomic(via, "{\"json\": 1}\n"));
  ::close(fd);
  PS_ASSERT_OK_AND_ASSIGN(std::string back, ReadFile(path));
  EXPECT_EQ(back, "printed before\n{\"json\": 1}\n");
  // A descriptor open only for reading is refused before a run, not after it.
  const int ro = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  ASSERT_GE(ro, 0);
  EXPECT_THAT(CheckOutputPath("--json", "/dev/fd/" + std::to_string(ro)),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("descriptor " + std::to_string(ro) + " is not open for writing")));
  ::close(ro);
}

// A link to a regular file: the file is replaced atomically, the link stays a link.
TEST(FileUtilTest, WriteThroughALinkReplacesItsTarget) {
  const std::string target = TempPath("link-target"), link = TempPath("link");
  PS_ASSERT_OK(WriteFileAtomic(target, "old"));
  ::unlink(link.c_str());
  ASSERT_EQ(::symlink(target.c_str(), link.c_str()), 0) << std::strerror(errno);
  PS_EXPECT_OK(WriteFileAtomic(link, "new"));
  struct stat st {};
  ASSERT_EQ(::lstat(link.c_str(), &st), 0);
  EXPECT_TRUE(S_ISLNK(st.st_mode));
  PS_ASSERT_OK_AND_ASSIGN(std::string back, ReadFile(target));
  EXPECT_EQ(back, "new");
  ::unlink(link.c_str());
}

// Paths that cannot name a file are bad input (exit 2 in the CLI), not a failure.
TEST(FileUtilTest, LinkLoopsAndOverlongNamesAreInvalidArguments) {
  const std::string a = TempPath("loop-a"), b = TempPath("loop-b");
  ::unlink(a.c_str());
  ::unlink(b.c_str());
  ASSERT_EQ(::symlink(b.c_str(), a.c_str()), 0);
  ASSERT_EQ(::symlink(a.c_str(), b.c_str()), 0);
  EXPECT_THAT(ReadFile(a), StatusIs(absl::StatusCode::kInvalidArgument,
                                    HasSubstr("Too many levels of symbolic links")));
  EXPECT_THAT(WriteFileAtomic(a, "x"),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("symbolic links")));
  EXPECT_THAT(ReadFile(TempPath(std::string(5000, 'n'))),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("File name too long")));
  ::unlink(a.c_str());
  ::unlink(b.c_str());
}

TEST(FileUtilTest, CheckOutputPathSaysWhatIsWrongAndWhatWorks) {
  const char* tmp = std::getenv("TMPDIR");
  const std::string dir = tmp ? tmp : "/tmp";
  PS_EXPECT_OK(CheckOutputPath("--csv", dir + "/pipesched_out.csv"));
  PS_EXPECT_OK(CheckOutputPath("--csv", "relative-in-cwd.csv"));
  const auto kBad = absl::StatusCode::kInvalidArgument;
  EXPECT_THAT(CheckOutputPath("--csv", "/nonexistent/dir/x.csv"),
              StatusIs(kBad, HasSubstr("--csv=/nonexistent/dir/x.csv: the directory "
                                       "/nonexistent/dir does not exist; give a file path in a "
                                       "writable directory")));
  EXPECT_THAT(CheckOutputPath("--json", dir),
              StatusIs(kBad, HasSubstr("--json=" + dir + ": is a directory")));
  const std::string file = TempPath("not_a_dir");
  PS_ASSERT_OK(WriteFileAtomic(file, "x"));
  EXPECT_THAT(CheckOutputPath("--svg", file + "/x.svg"),
              StatusIs(kBad, HasSubstr(file + " is not a directory")));
  EXPECT_THAT(CheckOutputPath("--json", " "),
              StatusIs(kBad, "--json=' ' is only blanks; give a file path, or leave the flag out"));
}

}  // namespace
}  // namespace pipesched
