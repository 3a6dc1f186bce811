// The version a user compiles against (pipesched/version.h) and the one linked
// (GetVersion, VersionString) agree, and agree with the project() version.
#include "pipesched/version.h"

#include <string>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"

namespace pipesched {
namespace {

TEST(VersionTest, LinkedVersionMatchesHeader) {
  const Version v = GetVersion();
  EXPECT_EQ(v.major, PIPESCHED_VERSION_MAJOR);
  EXPECT_EQ(v.minor, PIPESCHED_VERSION_MINOR);
  EXPECT_EQ(v.patch, PIPESCHED_VERSION_PATCH);
}

TEST(VersionTest, StringIsMajorDotMinorDotPatch) {
  const Version v = GetVersion();
  EXPECT_EQ(std::string(VersionString()), absl::StrCat(v.major, ".", v.minor, ".", v.patch));
  EXPECT_STREQ(VersionString(), PIPESCHED_VERSION_STRING);
}

TEST(VersionTest, MatchesTheProjectVersion) {
  // CMakeLists.txt: project(pipesched VERSION ...), passed in by tests/base/CMakeLists.txt.
  EXPECT_STREQ(VersionString(), PIPESCHED_PROJECT_VERSION);
}

TEST(VersionTest, HasCudaIsZeroOrOne) {
  EXPECT_TRUE(PIPESCHED_HAS_CUDA == 0 || PIPESCHED_HAS_CUDA == 1);
}

}  // namespace
}  // namespace pipesched
