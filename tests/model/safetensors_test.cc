// safetensors: round trips, the byte layout, and every error a corrupt file can cause;
// the file reader refuses what is not safetensors by its first bytes and a header that
// does not fit the file before reading the data.
#include "pipesched/model/safetensors.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <string>
#include <system_error>
#include <thread>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "pipesched/base/file_util.h"
#include "pipesched/base/host_memory.h"
#include "pipesched/model/synthetic.h"
#include "testing/status_matchers.h"

namespace pipesched::model {
namespace {

using pipesched::testing::StatusIs;
using ::testing::HasSubstr;

std::string TempPath(const std::string& name) {
  return (std::filesystem::path(::testing::TempDir()) / name).string();
}

// A file with the given JSON header and `data_bytes` zero bytes of data.
std::string Raw(const std::string& header, std::size_t data_bytes) {
  std::string out(8, '\0');
  const std::uint64_t len = header.size();
  std::memcpy(out.data(), &len, 8);
  return out + header + std::string(data_bytes, '\0');
}

TEST(SafetensorsTest, RoundTripsEveryDtypeAndMetadata) {
  SafetensorsFile file;
  file.tensors.push_back(HostTensor::F32("w", {2, 3}, {1, 2, 3, 4, 5, 6.5f}));
  file.tensors.push_back(HostTensor::I32("y", {3}, {0, -1, 7}));
  file.tensors.push_back(HostTensor::I64("big", {1}, {1ll << 40}));
  file.tensors.push_back(HostTensor::F32("scalar", {}, {3.0f}));
  file.metadata["format"] = "pt";
  const std::string path = TempPath("round_trip.safetensors");
  PS_ASSERT_OK(WriteSafetensors(path, file));
  PS_ASSERT_OK_AND_ASSIGN(SafetensorsFile back, ReadSafetensors(path));
  ASSERT_EQ(back.tensors.size(), 4u);
  EXPECT_EQ(back.metadata.at("format"), "pt");
  for (std::size_t i = 0; i < 4; ++i) {
    EXPECT_EQ(back.tensors[i].name, file.tensors[i].name);
    EXPECT_EQ(back.tensors[i].dtype, file.tensors[i].dtype);
    EXPECT_EQ(back.tensors[i].shape, file.tensors[i].shape);
    EXPECT_EQ(back.tensors[i].bytes, file.tensors[i].bytes);
  }
  EXPECT_EQ(*back.tensors[0].ToFloats(), (std::vector<float>{1, 2, 3, 4, 5, 6.5f}));
  EXPECT_EQ(*back.tensors[1].ToInt32s(), (std::vector<std::int32_t>{0, -1, 7}));
  PS_ASSERT_OK_AND_ASSIGN(const HostTensor* y, back.Find("y"));
  EXPECT_EQ(y->numel(), 3);
  EXPECT_THAT(back.Find("nope"),
              StatusIs(absl::StatusCode::kNotFound, HasSubstr("no tensor 'nope' (tensors: w, y")));
}

TEST(SafetensorsTest, LayoutIsTheFormatsOwn) {
  SafetensorsFile file;
  file.tensors.push_back(HostTensor::F32("a", {2}, {1.0f, 2.0f}));
  PS_ASSERT_OK_AND_ASSIGN(std::string bytes, SerializeSafetensors(file));
  std::uint64_t len = 0;
  std::memcpy(&len, bytes.data(), 8);
  EXPECT_EQ(len % 8, 0u);  // padded with spaces
  EXPECT_EQ(bytes.size(), 8 + len + 8);
  const std::string header = bytes.substr(8, len);
  EXPECT_THAT(header, HasSubstr(R"("a":{"data_offsets":[0,8],"dtype":"F32","shape":[2]})"));
  float v[2];
  std::memcpy(v, bytes.data() + 8 + len, 8);
  EXPECT_EQ(v[1], 2.0f);
}

TEST(SafetensorsTest, ReadsFilesFromOtherWritersWithUnpaddedHeaders) {
  // As PyTorch's safetensors writes a {"x": int64 [2]} file (key order differs).
  std::string raw = Raw(R"({"x":{"shape":[2],"dtype":"I64","data_offsets":[0,16]}})", 0);
  std::int64_t values[2] = {3, 4};
  raw.append(reinterpret_cast<const char*>(values), 16);
  PS_ASSERT_OK_AND_ASSIGN(SafetensorsFile f, ParseSafetensors(raw, "torch"));
  EXPECT_EQ(*f.tensors[0].ToInt32s(), (std::vector<std::int32_t>{3, 4}));
}

struct BadCase {
  std::string name;
  std::string bytes;
  std::string message;
};

TEST(SafetensorsTest, EveryCorruptionIsNamed) {
  const std::string ok_entry = R"("a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]})";
  std::string huge(8, '\0');
  const std::uint64_t huge_len = 1ull << 40;
  std::memcpy(huge.data(), &huge_len, 8);
  const std::vector<BadCase> cases = {
      {"short", std::string(5, '\0'), "truncated: 5 bytes, need at least 8"},
      {"header past end", Raw("{}", 0).substr(0, 9), "header length is 2 bytes but only 1 follow"},
      {"huge header", huge, "exceeds the limit"},
      {"not json", Raw("{nope", 0), "header is not valid JSON"},
      {"not object", Raw("[1,2]", 0), "header is not a JSON object"},
      {"entry not object", Raw(R"({"a":3})", 0), "tensor 'a': entry is not an object"},
      {"no dtype", Raw(R"({"a":{"shape":[1],"data_offsets":[0,4]}})", 4),
       "tensor 'a': missing string 'dtype'"},
      {"bad dtype", Raw(R"({"a":{"dtype":"F16","shape":[1],"data_offsets":[0,2]}})", 2),
       "tensor 'a': dtype 'F16' is not supported (supported: F32, I32, I64)"},
      {"no shape", Raw(R"({"a":{"dtype":"F32","data_offsets":[0,4]}})", 4),
       "tensor 'a': missing array 'shape'"},
      {"negative shape", Raw(R"({"a":{"dtype":"F32","shape":[-1],"data_offsets":[0,4]}})", 4),
       "tensor 'a': shape entry -1 is not a non-negative integer"},
      {"bad offsets", Raw(R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[0]}})", 4),
       "tensor 'a': 'data_offsets' must be [begin, end]"},
      {"offsets out of range", Raw("{" + ok_entry + "}", 4),
       "tensor 'a': data_offsets [0, 8) out of range of the 4 data bytes (file truncated?)"},
      {"size mismatch", Raw(R"({"a":{"dtype":"F32","shape":[3],"data_offsets":[0,8]}})", 8),
       "tensor 'a': data_offsets [0, 8) hold 8 bytes but F32 (3) needs 12"},
      {"overlap",
       Raw("{" + ok_entry + R"(,"b":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}})", 8),
       "overlaps"},
      {"gap", Raw(R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}})", 8),
       "tensor 'a' starts at data byte 4 but the previous data ends at 0"},
      {"trailing", Raw("{" + ok_entry + "}", 12), "cover 8 data bytes but the file holds 12"},
      {"bad metadata", Raw(R"({"__metadata__":{"k":1}})", 0),
       "__metadata__ key 'k' is not a string"},
  };
  // The file reader checks in another order (sizes first, before reading), with the
  // same outcome.
  const std::string path = TempPath("corrupt.safetensors");
  for (const BadCase& c : cases) {
    EXPECT_THAT(ParseSafetensors(c.bytes, "f.st"),
                StatusIs(absl::StatusCode::kInvalidArgument,
                         ::testing::AllOf(HasSubstr("safetensors 'f.st'"), HasSubstr(c.message))))
        << c.name;
    PS_ASSERT_OK(WriteFileAtomic(path, c.bytes));
    EXPECT_THAT(
        ReadSafetensors(path),
        StatusIs(absl::StatusCode::kInvalidArgument,
                 ::testing::AllOf(HasSubstr("safetensors '" + path + "'"), HasSubstr(c.message))))
        << c.name;
  }
}

// What is not safetensors is refused by its first 8 bytes, naming what would work.
TEST(SafetensorsTest, ReadRefusesWhatIsNotSafetensorsByItsHeaderLength) {
  const std::string path = TempPath("not_safetensors");
  std::string length_1000(8, '\0');
  const std::uint64_t len = 1000;
  std::memcpy(length_1000.data(), &len, 8);
  const std::vector<BadCase> cases = {
      {"zeros, as /dev/zero", std::string(4096, '\0'),
       "header length is 0: not a safetensors file (one starts with the length of its JSON "
       "header); write it with safetensors' save_file"},
      {"empty", "", "truncated: 0 bytes, need at least 8 for the header length"},
      {"length past the end", length_1000 + "{}",
       "truncated: header length is 1000 bytes but only 2 follow: a truncated file or not a "
       "safetensors file; write it with safetensors' save_file"},
      {"text", "just some text, not a tensor file",
       "exceeds the limit of 100000000 bytes: not a safetensors file"},
  };
  for (const BadCase& c : cases) {
    PS_ASSERT_OK(WriteFileAtomic(path, c.bytes));
    EXPECT_THAT(ReadSafetensors(path),
                StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr(c.message)))
        << c.name;
    EXPECT_THAT(ParseSafetensors(c.bytes, path),
                StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr(c.message)))
        << c.name;
  }
  std::remove(path.c_str());
}

TEST(SafetensorsTest, ReadRefusesDevicesAndDirectories) {
  EXPECT_THAT(ReadSafetensors("/dev/zero"),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("safetensors '/dev/zero': is a character device, not a regular "
                                 "file; give a safetensors file (write it with safetensors' "
                                 "save_file)")));
  EXPECT_THAT(ReadSafetensors(::testing::TempDir()),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("is a directory, not a regular file")));
}

// Sparse files larger than the reader may load (half the host memory available) whose
// headers do not fit them: each error is the header's, so nothing past the header was
// read (reading such a file whole ends in the size limit, or takes gigabytes and seconds).
TEST(SafetensorsTest, LargeSparseFilesWithBadHeadersFailAtTheirHeaders) {
  const std::uint64_t available = HostMemoryAvailableBytes().value_or(0);
  const std::uint64_t large = std::max<std::uint64_t>(std::uint64_t{3} << 29, available + 1);
  const std::string path = TempPath("sparse.safetensors");
  // `head`, then zeros up to `size` bytes, without writing them.
  auto sparse = [&](const std::string& head, std::uint64_t size) {
    PS_EXPECT_OK(WriteFileAtomic(path, head));
    std::error_code ec;
    std::filesystem::resize_file(path, size, ec);
    return ec;
  };
  if (std::error_code ec = sparse("", large); ec) {
    GTEST_SKIP() << "cannot make a sparse file of " << large << " bytes here: " << ec.message();
  }
  EXPECT_THAT(ReadSafetensors(path),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("header length is 0: not a safetensors file")));

  const std::string one_tensor = R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}})";
  ASSERT_FALSE(sparse(Raw(one_tensor, 8), large));
  EXPECT_THAT(
      ReadSafetensors(path),
      StatusIs(absl::StatusCode::kInvalidArgument,
               HasSubstr(absl::StrCat("the tensors cover 8 data bytes but the file holds ",
                                      large - 8 - one_tensor.size(), " (trailing bytes)"))));

  // A header that claims more data than the file has (4 TiB).
  const std::string lying =
      R"({"a":{"dtype":"F32","shape":[1099511627776],"data_offsets":[0,4398046511104]}})";
  ASSERT_FALSE(sparse(Raw(lying, 0), large));
  EXPECT_THAT(
      ReadSafetensors(path),
      StatusIs(absl::StatusCode::kInvalidArgument,
               HasSubstr(absl::StrCat("tensor 'a': data_offsets [0, 4398046511104) out of "
                                      "range of the ",
                                      large - 8 - lying.size(), " data bytes (file truncated?)"))));

  // A valid header whose one tensor is larger than the reader may hold.
  if (available > 0) {
    const std::uint64_t n = available / 4 + 1;  // F32 elements: more than all of it
    const std::string huge = absl::StrCat(R"({"a":{"dtype":"F32","shape":[)", n,
                                          R"(],"data_offsets":[0,)", 4 * n, "]}}");
    ASSERT_FALSE(sparse(Raw(huge, 0), 8 + huge.size() + 4 * n));
    EXPECT_THAT(ReadSafetensors(path),
                StatusIs(absl::StatusCode::kResourceExhausted,
                         HasSubstr("more than half the host memory available")));
  }
  std::remove(path.c_str());
}

// A pipe (--data=<(...)) is read as far as its header says, and must end there.
TEST(SafetensorsTest, ReadsAPipeAsFarAsItsHeaderSays) {
  SafetensorsFile file;
  file.tensors.push_back(HostTensor::F32("w", {2, 3}, {1, 2, 3, 4, 5, 6}));
  file.tensors.push_back(HostTensor::I64("y", {2}, {7, 8}));
  PS_ASSERT_OK_AND_ASSIGN(const std::string good, SerializeSafetensors(file));
  const std::string path = TempPath("pipe.safetensors");
  // Writes `bytes` (less than a pipe's buffer, so the write never waits for the reader)
  // into a new FIFO at `path` while it is read.
  auto read_through_pipe = [&](const std::string& bytes) {
    std::remove(path.c_str());
    EXPECT_EQ(::mkfifo(path.c_str(), 0600), 0) << std::strerror(errno);
    std::thread writer([&] {
      const int fd = ::open(path.c_str(), O_WRONLY);
      if (fd < 0) return;
      EXPECT_EQ(::write(fd, bytes.data(), bytes.size()), static_cast<ssize_t>(bytes.size()));
      ::close(fd);
    });
    absl::StatusOr<SafetensorsFile> read = ReadSafetensors(path);
    writer.join();
    std::remove(path.c_str());
    return read;
  };
  PS_ASSERT_OK_AND_ASSIGN(SafetensorsFile back, read_through_pipe(good));
  ASSERT_EQ(back.tensors.size(), 2u);
  EXPECT_EQ(back.tensors[0].bytes, file.tensors[0].bytes);
  EXPECT_EQ(*back.tensors[1].ToInt32s(), (std::vector<std::int32_t>{7, 8}));
  EXPECT_THAT(read_through_pipe(good + "more"),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("the tensors cover 40 data bytes but more follow (trailing "
                                 "bytes)")));
  EXPECT_THAT(read_through_pipe(good.substr(0, good.size() - 1)),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("truncated: the tensors need 40 data bytes but only 39 follow")));
  EXPECT_THAT(read_through_pipe(std::string(100, '\0')),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("header length is 0")));
}

// Files from other writers still load through the file reader: no tensors, an empty
// tensor, an unpadded header.
TEST(SafetensorsTest, ReadLoadsSmallAndForeignFiles) {
  const std::string path = TempPath("small.safetensors");
  PS_ASSERT_OK(WriteFileAtomic(path, Raw(R"({"__metadata__":{"format":"pt"}})", 0)));
  PS_ASSERT_OK_AND_ASSIGN(SafetensorsFile none, ReadSafetensors(path));
  EXPECT_TRUE(none.tensors.empty());
  EXPECT_EQ(none.metadata.at("format"), "pt");
  std::string raw = Raw(R"({"e":{"dtype":"F32","shape":[0,3],"data_offsets":[0,0]},)"
                        R"("x":{"shape":[2],"dtype":"I64","data_offsets":[0,16]}})",
                        0);
  const std::int64_t values[2] = {3, -4};
  raw.append(reinterpret_cast<const char*>(values), 16);
  PS_ASSERT_OK(WriteFileAtomic(path, raw));
  PS_ASSERT_OK_AND_ASSIGN(SafetensorsFile f, ReadSafetensors(path));
  ASSERT_EQ(f.tensors.size(), 2u);
  EXPECT_EQ(f.tensors[0].numel(), 0);
  EXPECT_EQ(*f.tensors[1].ToInt32s(), (std::vector<std::int32_t>{3, -4}));
  std::remove(path.c_str());
}

TEST(SafetensorsTest, ReadErrorsNameThePath) {
  EXPECT_THAT(ReadSafetensors(TempPath("missing.safetensors")),
              StatusIs(absl::StatusCode::kNotFound, HasSubstr("missing.safetensors")));
}

TEST(SafetensorsTest, WriterRejectsBadTensorsAndLeavesOldFile) {
  const std::string path = TempPath("keep.safetensors");
  SafetensorsFile good;
  good.tensors.push_back(HostTensor::F32("a", {1}, {1.0f}));
  PS_ASSERT_OK(WriteSafetensors(path, good));
  SafetensorsFile bad = good;
  bad.tensors.push_back(HostTensor::F32("a", {1}, {2.0f}));
  EXPECT_THAT(WriteSafetensors(path, bad),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("cannot write tensor 'a': duplicate name")));
  bad.tensors = {HostTensor::F32("b", {3}, {1.0f})};
  EXPECT_THAT(SerializeSafetensors(bad),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("'b': holds 4 bytes but F32 (3) needs 12")));
  bad.tensors = {HostTensor::F32("__metadata__", {1}, {1.0f})};
  EXPECT_THAT(SerializeSafetensors(bad),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("reserved")));
  PS_ASSERT_OK_AND_ASSIGN(SafetensorsFile back, ReadSafetensors(path));
  EXPECT_EQ(*back.tensors[0].ToFloats(), std::vector<float>{1.0f});
}

TEST(SafetensorsTest, ConversionErrorsNameTheTensor) {
  HostTensor f = HostTensor::F32("x", {1}, {1.0f});
  EXPECT_THAT(f.ToInt32s(), StatusIs(absl::StatusCode::kInvalidArgument,
                                     HasSubstr("tensor 'x' has dtype F32, expected I32 or I64")));
  HostTensor i = HostTensor::I64("y", {2}, {1, 1ll << 40});
  EXPECT_THAT(i.ToInt32s(), StatusIs(absl::StatusCode::kInvalidArgument,
                                     HasSubstr("tensor 'y' element 1 (1099511627776)")));
  EXPECT_THAT(i.ToFloats(), StatusIs(absl::StatusCode::kInvalidArgument,
                                     HasSubstr("tensor 'y' has dtype I64, expected F32")));
}

TEST(SyntheticTest, DeterministicMeaningfulAndSliceIndependent) {
  SyntheticConfig config;
  config.d_in = 12;
  config.num_classes = 5;
  config.num_samples = 400;
  config.seed = 9;
  PS_ASSERT_OK_AND_ASSIGN(Dataset a, MakeSynthetic(config));
  PS_ASSERT_OK_AND_ASSIGN(Dataset b, MakeSynthetic(config));
  EXPECT_EQ(a.x, b.x);
  EXPECT_EQ(a.y, b.y);
  // Sample i depends only on (seed, i): a shorter data set is a prefix.
  config.num_samples = 50;
  PS_ASSERT_OK_AND_ASSIGN(Dataset prefix, MakeSynthetic(config));
  EXPECT_EQ(prefix.y, std::vector<std::int32_t>(a.y.begin(), a.y.begin() + 50));
  EXPECT_EQ(prefix.x, std::vector<float>(a.x.begin(), a.x.begin() + 50 * 12));
  // Another seed gives other data.
  config.seed = 10;
  PS_ASSERT_OK_AND_ASSIGN(Dataset other, MakeSynthetic(config));
  EXPECT_NE(other.x, prefix.x);
  // Gaussian inputs, every class used.
  double mean = 0, sq = 0;
  for (float v : a.x) {
    mean += v;
    sq += double(v) * v;
  }
  mean /= a.x.size();
  EXPECT_NEAR(mean, 0.0, 0.05);
  EXPECT_NEAR(sq / a.x.size(), 1.0, 0.1);
  std::vector<int> counts(5);
  for (std::int32_t y : a.y) {
    ASSERT_GE(y, 0);
    ASSERT_LT(y, 5);
    ++counts[y];
  }
  for (int c : counts) EXPECT_GT(c, 0);
  config.num_classes = 0;
  EXPECT_THAT(MakeSynthetic(config), StatusIs(absl::StatusCode::kInvalidArgument,
                                              HasSubstr("num_classes must be at least 1")));
}

TEST(SyntheticTest, SaveAndLoadDataset) {
  SyntheticConfig config;
  config.d_in = 4;
  config.num_classes = 3;
  config.num_samples = 10;
  PS_ASSERT_OK_AND_ASSIGN(Dataset a, MakeSynthetic(config));
  const std::string path = TempPath("data.safetensors");
  PS_ASSERT_OK(SaveDataset(path, a));
  PS_ASSERT_OK_AND_ASSIGN(Dataset b, LoadDataset(path));
  EXPECT_EQ(b.x, a.x);
  EXPECT_EQ(b.y, a.y);
  EXPECT_EQ(b.d_in, 4);
  EXPECT_EQ(b.num_classes, 3);

  // PyTorch-style int64 labels, no metadata: classes from the max label.
  SafetensorsFile torch;
  torch.tensors.push_back(HostTensor::F32("x", {2, 1}, {0.5f, 1.5f}));
  torch.tensors.push_back(HostTensor::I64("y", {2}, {0, 4}));
  PS_ASSERT_OK(WriteSafetensors(path, torch));
  PS_ASSERT_OK_AND_ASSIGN(Dataset c, LoadDataset(path));
  EXPECT_EQ(c.num_classes, 5);
  EXPECT_EQ(c.y, (std::vector<std::int32_t>{0, 4}));

  torch.tensors[1] = HostTensor::I64("y", {3}, {0, 1, 2});
  PS_ASSERT_OK(WriteSafetensors(path, torch));
  EXPECT_THAT(LoadDataset(path), StatusIs(absl::StatusCode::kInvalidArgument,
                                          HasSubstr("'x' has 2 samples but 'y' has 3")));
  torch.tensors.pop_back();
  PS_ASSERT_OK(WriteSafetensors(path, torch));
  EXPECT_THAT(LoadDataset(path),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("no tensor 'y'")));

  // An input that is not finite is refused by where it is.
  torch.tensors = {HostTensor::F32("x", {2, 3}, {0, 1, 2, 3, std::nanf(""), 5}),
                   HostTensor::I64("y", {2}, {0, 1})};
  PS_ASSERT_OK(WriteSafetensors(path, torch));
  EXPECT_THAT(LoadDataset(path),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("tensor 'x' holds nan at sample 1, feature 1: every input must "
                                 "be finite")));
}

}  // namespace
}  // namespace pipesched::model
