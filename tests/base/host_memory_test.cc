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

// Every machine this project builds on is Linux with /proc/meminfo.
TEST(HostMemoryTest, AvailableMemoryIsReadFromProcMeminfo) {
  const std::optional<std::int64_t> available = HostMemoryAvailableBytes();
  ASSERT_TRUE(available.has_value());
  EXPECT_GT(*available, std::int64_t{64} << 20);
  EXPECT_EQ(*available % 1024, 0);  // MemAvailable is in kB
}

}  // namespace
}  // namespace pipesched
