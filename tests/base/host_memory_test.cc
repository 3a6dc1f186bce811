#include "base/host_memory.h"

#include <cstdint>

#include "gtest/gtest.h"

namespace pipesched {
namespace {

TEST(HostMemoryTest, HumanBytesPicksTheUnit) {
  EXPECT_EQ(HumanBytes(0), "0 B");
  EXPECT_EQ(HumanBytes(1023), "1023 B");
  EXPECT_EQ(HumanBytes(1536), "1.5 KiB");
  EXPECT_EQ(HumanBytes(std::int64_t{12} << 20 | std::int64_t{1} << 18), "12.25 MiB");
  EXPECT_EQ(HumanBytes(std::int64_t{3} << 30), "3.00 GiB");
  EXPECT_EQ(HumanBytes(std::int64_t{496} << 30), "496.00 GiB");
}

TEST(HostMemoryTest, ParseByteSizeTakesBinaryAndDecimalUnits) {
  EXPECT_EQ(*ParseByteSize("4096"), 4096);
  EXPECT_EQ(*ParseByteSize("80GiB"), std::int64_t{80} << 30);
  EXPECT_EQ(*ParseByteSize("1.5 GiB"), std::int64_t{3} << 29);
  EXPECT_EQ(*ParseByteSize("512mib"), std::int64_t{512} << 20);
  EXPECT_EQ(*ParseByteSize("16GB"), 16'000'000'000);
  EXPECT_EQ(*ParseByteSize("2 TiB"), std::int64_t{2} << 40);
  EXPECT_EQ(*ParseByteSize("100B"), 100);
  for (const char* bad :
       {"", "GiB", "-1GiB", "1.2.3MiB", "12 parsecs", "0", "0.1", ".5GiB", "1e3", "5000000TiB"}) {
    absl::StatusOr<std::int64_t> parsed = ParseByteSize(bad);
    ASSERT_FALSE(parsed.ok()) << bad;
    EXPECT_EQ(parsed.status().code(), absl::StatusCode::kInvalidArgument) << bad;
    EXPECT_NE(parsed.status().message().find("e.g. 80GiB"), std::string::npos)
        << parsed.status().message();
  }
  EXPECT_NE(ParseByteSize("12 parsecs").status().message().find("unknown unit 'parsecs'"),
            std::string::npos);
}

// Every machine this project builds on is Linux with /proc/meminfo.
TEST(HostMemoryTest, AvailableMemoryIsReadFromProcMeminfo) {
  const std::optional<std::int64_t> available = HostMemoryAvailableBytes();
  ASSERT_TRUE(available.has_value());
  EXPECT_GT(*available, std::int64_t{64} << 20);
  EXPECT_EQ(*available % 1024, 0);  // MemAvailable is in kB
}

}  // namespace
}  // namespace pipesched
