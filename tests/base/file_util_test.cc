#include "base/file_util.h"

#include <cstdlib>
#include <string>

#include "gtest/gtest.h"
#include "testing/status_matchers.h"

namespace pipesched {
namespace {

using ::pipesched::testing::StatusIs;
using ::testing::HasSubstr;

std::string TempPath(const std::string& name) {
  const char* dir = std::getenv("TMPDIR");
  return std::string(dir ? dir : "/tmp") + "/pipesched_file_util_" + name;
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

// What a long run checks before it starts, so that it does not fail at the end.
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
}

}  // namespace
}  // namespace pipesched
