#include "pipesched/base/host_memory.h"

#include <cstdint>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "testing/capped_child.h"

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
  EXPECT_EQ(*ParseByteSize("4.0"), 4);
  // A larger unit rounds down to whole bytes; a fraction of a byte itself is refused.
  EXPECT_EQ(*ParseByteSize("1.1GiB"), 1181116006);
  for (const char* bad : {"", "GiB", "-1GiB", "1.2.3MiB", "12 parsecs", "0", "0.1", ".5GiB", "1e3",
                          "5000000TiB", "1.9", "1.5B"}) {
    absl::StatusOr<std::int64_t> parsed = ParseByteSize(bad);
    ASSERT_FALSE(parsed.ok()) << bad;
    EXPECT_EQ(parsed.status().code(), absl::StatusCode::kInvalidArgument) << bad;
    EXPECT_NE(parsed.status().message().find("e.g. 80GiB"), std::string::npos)
        << parsed.status().message();
  }
  EXPECT_NE(ParseByteSize("12 parsecs").status().message().find("unknown unit 'parsecs'"),
            std::string::npos);
  EXPECT_NE(
      ParseByteSize("1.9").status().message().find("'1.9' is not a size (a fraction of a byte)"),
      std::string::npos)
      << ParseByteSize("1.9").status().message();
}

// Every machine this project builds on is Linux with /proc/meminfo.
TEST(HostMemoryTest, AvailableMemoryIsReadFromProcMeminfo) {
  const MemoryFacts facts = ReadMemoryFacts();
  ASSERT_TRUE(facts.mem_available.has_value());
  EXPECT_GT(*facts.mem_available, std::int64_t{64} << 20);
  EXPECT_EQ(*facts.mem_available % 1024, 0);  // MemAvailable is in kB
  // Read again, later: MemAvailable may have moved since, so only its presence is checked.
  const std::optional<std::int64_t> available = HostMemoryAvailableBytes();
  ASSERT_TRUE(available.has_value());
  EXPECT_GT(*available, std::int64_t{64} << 20);
}

constexpr std::int64_t kGiB = std::int64_t{1} << 30;

TEST(HostMemoryTest, HeadroomIsTheTightestBoundAndSaysWhichItIs) {
  MemoryFacts facts{.mem_available = 20 * kGiB};
  EXPECT_EQ(HeadroomOf(facts)->bytes, 20 * kGiB);
  EXPECT_EQ(DescribeHeadroom(*HeadroomOf(facts)), "the machine has 20.00 GiB available");

  facts.address_space_limit = 4 * kGiB;
  facts.vm_size = kGiB;
  EXPECT_EQ(HeadroomOf(facts)->bytes, 3 * kGiB);
  EXPECT_EQ(DescribeHeadroom(*HeadroomOf(facts)),
            "this process's address-space limit (ulimit -v) leaves 3.00 GiB");

  facts.data_limit = 3 * kGiB;
  facts.vm_data = 2 * kGiB;
  EXPECT_EQ(DescribeHeadroom(*HeadroomOf(facts)),
            "this process's data-size limit (ulimit -d) leaves 1.00 GiB");

  facts.cgroup_headroom = kGiB / 2;
  EXPECT_EQ(HeadroomOf(facts)->bound, MemoryBound::kCgroup);
  EXPECT_EQ(DescribeHeadroom(*HeadroomOf(facts)),
            "the memory cgroup's limit (a container's) leaves 512.00 MiB");

  // A limit already passed leaves nothing, not a negative amount.
  facts.vm_size = 5 * kGiB;
  EXPECT_EQ(HeadroomOf(facts)->bytes, 0);
  EXPECT_EQ(HeadroomOf(facts)->bound, MemoryBound::kAddressSpace);

  // Ties go to the machine; without MemAvailable nothing is known.
  EXPECT_EQ(HeadroomOf({.mem_available = kGiB, .cgroup_headroom = kGiB})->bound,
            MemoryBound::kMachine);
  EXPECT_FALSE(HeadroomOf({.address_space_limit = kGiB}).has_value());
}

// Mapped but untouched address space (OpenBLAS's work buffers) is bound by the process's
// own limits only, never by the machine's or a cgroup's memory.
TEST(HostMemoryTest, MappingHeadroomIsTheTightestProcessLimit) {
  EXPECT_FALSE(MappingHeadroom({.mem_available = kGiB, .cgroup_headroom = kGiB / 2}).has_value());
  MemoryFacts facts{.mem_available = kGiB / 4, .cgroup_headroom = kGiB / 8};
  facts.address_space_limit = 4 * kGiB;
  facts.vm_size = kGiB;
  ASSERT_TRUE(MappingHeadroom(facts).has_value());
  EXPECT_EQ(MappingHeadroom(facts)->bytes, 3 * kGiB);
  EXPECT_EQ(MappingHeadroom(facts)->bound, MemoryBound::kAddressSpace);
  facts.data_limit = 3 * kGiB;
  facts.vm_data = 2 * kGiB;
  EXPECT_EQ(MappingHeadroom(facts)->bytes, kGiB);
  EXPECT_EQ(MappingHeadroom(facts)->bound, MemoryBound::kDataSize);
  // Under strict overcommit the kernel's commit limit binds mappings too.
  facts.commit_limit = 10 * kGiB;
  facts.committed = 9 * kGiB + kGiB / 2;
  EXPECT_EQ(MappingHeadroom(facts)->bytes, kGiB / 2);
  EXPECT_EQ(MappingHeadroom(facts)->bound, MemoryBound::kCommit);
  // Allocations too, where it is the tightest (here the cgroup's 128 MiB is).
  EXPECT_EQ(HeadroomOf(facts)->bound, MemoryBound::kCgroup);
  EXPECT_EQ(HeadroomOf({.mem_available = kGiB, .commit_limit = kGiB, .committed = kGiB / 4})->bytes,
            kGiB * 3 / 4);
  EXPECT_EQ(DescribeHeadroom(*MappingHeadroom(facts)),
            "the kernel's commit limit (strict overcommit, vm.overcommit_memory=2) leaves "
            "512.00 MiB");
  EXPECT_EQ(MappingHeadroom({.mem_available = kGiB, .commit_limit = kGiB, .committed = 0})->bound,
            MemoryBound::kCommit);
  facts.commit_limit = facts.committed = std::nullopt;
  // A limit whose use is unknown bounds nothing.
  EXPECT_FALSE(MappingHeadroom({.mem_available = kGiB, .address_space_limit = kGiB}).has_value());
  EXPECT_FALSE(MappingHeadroom({.mem_available = kGiB, .commit_limit = kGiB}).has_value());
  facts.vm_size = 5 * kGiB;
  EXPECT_EQ(MappingHeadroom(facts)->bytes, 0);
}

// Under `ulimit -v` the process can take far less than the machine has: the headroom
// says so (checks that rely on MemAvailable alone passed there, then failed allocating).
TEST(HostMemoryTest, AnAddressSpaceLimitBoundsTheHeadroom) {
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
  GTEST_SKIP() << "the sanitizers' runtimes need more address space than the cap leaves";
#else
  constexpr std::size_t kHeadroom = std::size_t{96} << 20;
  const std::optional<int> code = testing::RunWithCappedAddressSpace(kHeadroom, [] {
    const std::optional<MemoryHeadroom> h = HostMemoryHeadroom();
    if (!h.has_value()) return 10;
    if (h->bound != MemoryBound::kAddressSpace) return 11;
    // The cap is the size at fork plus 96 MiB; what the child has mapped since (reading
    // files) comes off it.
    if (h->bytes > static_cast<std::int64_t>(kHeadroom) ||
        h->bytes < static_cast<std::int64_t>(kHeadroom) - (std::int64_t{32} << 20)) {
      return 12;
    }
    if (DescribeHeadroom(*h).find("ulimit -v") == std::string::npos) return 13;
    return HostMemoryAvailableBytes() == h->bytes ? 0 : 14;
  });
  ASSERT_TRUE(code.has_value());
  EXPECT_EQ(*code, 0);
#endif
}

}  // namespace
}  // namespace pipesched
