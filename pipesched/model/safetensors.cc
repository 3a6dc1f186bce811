// safetensors reader and writer. The reader checks everything a corrupt or foreign file
// can get wrong before touching data: sizes, JSON shape, dtypes, offsets, overlaps. From a
// file it reads the 8-byte header length first, checks it against the file's size, then
// reads and checks the header against the data section's size, and only then the data:
// a file that is not safetensors (/dev/zero, a sparse file) or whose header lies about
// sizes fails after reading at most its header.
#include "pipesched/model/safetensors.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <bit>
#include <cerrno>
#include <cstring>
#include <limits>
#include <new>
#include <optional>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "nlohmann/json.hpp"
#include "pipesched/base/file_util.h"
#include "pipesched/base/host_memory.h"
#include "pipesched/base/json_util.h"
#include "pipesched/base/status.h"
#include "pipesched/base/strings.h"

namespace pipesched::model {
namespace {

static_assert(std::endian::native == std::endian::little,
              "safetensors data is little-endian; this host is not");

constexpr std::uint64_t kMaxHeaderBytes = 100'000'000;  // the format's own limit
constexpr std::string_view kMetadataKey = "__metadata__";

template <typename T>
std::string ToBytes(const std::vector<T>& values) {
  std::string bytes(values.size() * sizeof(T), '\0');
  if (!values.empty()) std::memcpy(bytes.data(), values.data(), bytes.size());
  return bytes;
}

template <typename T>
std::vector<T> FromBytes(const std::string& bytes) {
  std::vector<T> values(bytes.size() / sizeof(T));
  if (!values.empty()) std::memcpy(values.data(), bytes.data(), values.size() * sizeof(T));
  return values;
}

absl::StatusOr<DType> ParseDType(const std::string& name) {
  if (name == "F32") return DType::kF32;
  if (name == "I32") return DType::kI32;
  if (name == "I64") return DType::kI64;
  return absl::InvalidArgumentError(
      absl::StrCat("dtype '", name, "' is not supported (supported: F32, I32, I64)"));
}

std::string ShapeString(const std::vector<std::int64_t>& shape) {
  return absl::StrCat("(", absl::StrJoin(shape, ", "), ")");
}

// Checks that `shape` is a list of non-negative integers whose product does not overflow.
absl::StatusOr<std::int64_t> ShapeNumel(const std::vector<std::int64_t>& shape) {
  std::int64_t n = 1;
  for (std::int64_t d : shape) {
    if (d < 0) return absl::InvalidArgumentError(absl::StrCat("negative dimension ", d));
    if (d != 0 && n > std::numeric_limits<std::int64_t>::max() / 16 / d) {
      return absl::InvalidArgumentError(
          absl::StrCat("shape ", ShapeString(shape), " is too large"));
    }
    n *= d;
  }
  return n;
}

}  // namespace

std::string_view DTypeName(DType dtype) {
  switch (dtype) {
    case DType::kF32:
      return "F32";
    case DType::kI32:
      return "I32";
    case DType::kI64:
      return "I64";
  }
  return "?";
}

std::int64_t DTypeSize(DType dtype) { return dtype == DType::kI64 ? 8 : 4; }

HostTensor HostTensor::F32(std::string name, std::vector<std::int64_t> shape,
                           const std::vector<float>& values) {
  return {std::move(name), DType::kF32, std::move(shape), ToBytes(values)};
}
HostTensor HostTensor::I32(std::string name, std::vector<std::int64_t> shape,
                           const std::vector<std::int32_t>& values) {
  return {std::move(name), DType::kI32, std::move(shape), ToBytes(values)};
}
HostTensor HostTensor::I64(std::string name, std::vector<std::int64_t> shape,
                           const std::vector<std::int64_t>& values) {
  return {std::move(name), DType::kI64, std::move(shape), ToBytes(values)};
}

std::int64_t HostTensor::numel() const {
  std::int64_t n = 1;
  for (std::int64_t d : shape) n *= d;
  return n;
}

absl::StatusOr<std::vector<float>> HostTensor::ToFloats() const {
  if (dtype != DType::kF32) {
    return absl::InvalidArgumentError(
        absl::StrCat("tensor '", name, "' has dtype ", Absl(DTypeName(dtype)), ", expected F32"));
  }
  return FromBytes<float>(bytes);
}

absl::StatusOr<std::vector<std::int32_t>> HostTensor::ToInt32s() const {
  if (dtype == DType::kI32) return FromBytes<std::int32_t>(bytes);
  if (dtype == DType::kI64) {
    std::vector<std::int64_t> wide = FromBytes<std::int64_t>(bytes);
    std::vector<std::int32_t> narrow(wide.size());
    for (std::size_t i = 0; i < wide.size(); ++i) {
      if (wide[i] < std::numeric_limits<std::int32_t>::min() ||
          wide[i] > std::numeric_limits<std::int32_t>::max()) {
        return absl::InvalidArgumentError(absl::StrCat("tensor '", name, "' element ", i, " (",
                                                       wide[i], ") does not fit in int32"));
      }
      narrow[i] = static_cast<std::int32_t>(wide[i]);
    }
    return narrow;
  }
  return absl::InvalidArgumentError(absl::StrCat("tensor '", name, "' has dtype ",
                                                 Absl(DTypeName(dtype)), ", expected I32 or I64"));
}

absl::StatusOr<const HostTensor*> SafetensorsFile::Find(std::string_view name) const {
  std::vector<std::string> names;
  for (const HostTensor& t : tensors) {
    if (t.name == name) return &t;
    names.push_back(t.name);
  }
  return absl::NotFoundError(
      absl::StrCat("no tensor '", Absl(name),
                   "' (tensors: ", names.empty() ? "none" : absl::StrJoin(names, ", "), ")"));
}

namespace {

// What a file that is not safetensors, or is cut short, should have been instead.
constexpr std::string_view kWhatWorks = "write it with safetensors' save_file";

absl::Status FormatError(std::string_view source, std::string_view what) {
  return absl::InvalidArgumentError(absl::StrCat("safetensors '", Absl(source), "': ", Absl(what)));
}

// The checks on the first 8 bytes, made before anything else is read. `follow`: the bytes
// after them, where known (a regular file, bytes in memory; not a pipe).
absl::Status CheckHeaderLength(std::uint64_t header_len, std::optional<std::uint64_t> follow,
                               std::string_view source) {
  if (header_len == 0) {
    return FormatError(source, absl::StrCat("header length is 0: not a safetensors file (one "
                                            "starts with the length of its JSON header); ",
                                            Absl(kWhatWorks)));
  }
  if (header_len > kMaxHeaderBytes) {
    return FormatError(source, absl::StrCat("header length ", header_len, " exceeds the limit of ",
                                            kMaxHeaderBytes, " bytes: not a safetensors file; ",
                                            Absl(kWhatWorks)));
  }
  if (follow.has_value() && header_len > *follow) {
    return FormatError(
        source,
        absl::StrCat("truncated: header length is ", header_len, " bytes but only ", *follow,
                     " follow: a truncated file or not a safetensors file; ", Absl(kWhatWorks)));
  }
  return absl::OkStatus();
}

absl::Status TooShortForTheLength(std::uint64_t size, std::string_view source) {
  return FormatError(source, absl::StrCat("truncated: ", size,
                                          " bytes, need at least 8 for the header length: a "
                                          "truncated file or not a safetensors file; ",
                                          Absl(kWhatWorks)));
}

// What a header says: the tensors (bytes not filled in) in data order, tiling the data
// section [0, data_bytes) exactly.
struct Layout {
  SafetensorsFile file;
  std::uint64_t data_bytes = 0;
};

// Parses and checks the JSON header. `data_size`: the size of the data section where
// known; every offset is checked against it. Unknown (a pipe), the tensors' extent is
// what must follow, and the caller checks that it does.
absl::StatusOr<Layout> ParseHeader(std::string_view header_text,
                                   std::optional<std::uint64_t> data_size,
                                   std::string_view source) {
  auto error = [&](const std::string& what) { return FormatError(source, what); };
  absl::StatusOr<nlohmann::json> parsed_header = ParseJson(header_text);
  if (!parsed_header.ok()) {
    return error(absl::StrCat("header is not valid JSON: ", parsed_header.status().message()));
  }
  nlohmann::json header = *std::move(parsed_header);
  if (!header.is_object()) return error("header is not a JSON object");

  SafetensorsFile file;
  struct Range {
    std::uint64_t begin, end;
    std::size_t index;
  };
  std::vector<Range> ranges;
  for (auto it = header.begin(); it != header.end(); ++it) {
    const std::string& key = it.key();
    const nlohmann::json& value = it.value();
    if (key == kMetadataKey) {
      if (!value.is_object()) return error("__metadata__ is not an object");
      for (auto m = value.begin(); m != value.end(); ++m) {
        if (!m.value().is_string()) {
          return error(absl::StrCat("__metadata__ key '", m.key(), "' is not a string"));
        }
        file.metadata[m.key()] = m.value().get<std::string>();
      }
      continue;
    }
    auto tensor_error = [&](const std::string& what) {
      return error(absl::StrCat("tensor '", key, "': ", what));
    };
    if (!value.is_object()) return tensor_error("entry is not an object");
    if (!value.contains("dtype") || !value["dtype"].is_string()) {
      return tensor_error("missing string 'dtype'");
    }
    absl::StatusOr<DType> dtype = ParseDType(value["dtype"].get<std::string>());
    if (!dtype.ok()) return tensor_error(std::string(dtype.status().message()));
    if (!value.contains("shape") || !value["shape"].is_array()) {
      return tensor_error("missing array 'shape'");
    }
    HostTensor tensor;
    tensor.name = key;
    tensor.dtype = *dtype;
    for (const nlohmann::json& d : value["shape"]) {
      if (!d.is_number_integer() || d.get<std::int64_t>() < 0) {
        return tensor_error(
            absl::StrCat("shape entry ", JsonForMessage(d), " is not a non-negative integer"));
      }
      tensor.shape.push_back(d.get<std::int64_t>());
    }
    absl::StatusOr<std::int64_t> numel = ShapeNumel(tensor.shape);
    if (!numel.ok()) return tensor_error(std::string(numel.status().message()));
    const nlohmann::json* offsets =
        value.contains("data_offsets") ? &value["data_offsets"] : nullptr;
    if (offsets == nullptr || !offsets->is_array() || offsets->size() != 2 ||
        !(*offsets)[0].is_number_unsigned() || !(*offsets)[1].is_number_unsigned()) {
      return tensor_error("'data_offsets' must be [begin, end] with non-negative integers");
    }
    const std::uint64_t begin = (*offsets)[0].get<std::uint64_t>();
    const std::uint64_t end = (*offsets)[1].get<std::uint64_t>();
    if (begin > end || (data_size.has_value() && end > *data_size)) {
      const bool past_end = data_size.has_value() && end > *data_size;
      return tensor_error(
          absl::StrCat("data_offsets [", begin, ", ", end, ") out of range of the ",
                       data_size.has_value() ? absl::StrCat(*data_size, " data bytes") : "data",
                       past_end ? " (file truncated?)" : ""));
    }
    const std::uint64_t expected = static_cast<std::uint64_t>(*numel * DTypeSize(*dtype));
    if (end - begin != expected) {
      return tensor_error(absl::StrCat("data_offsets [", begin, ", ", end, ") hold ", end - begin,
                                       " bytes but ", Absl(DTypeName(*dtype)), " ",
                                       ShapeString(tensor.shape), " needs ", expected));
    }
    ranges.push_back({begin, end, file.tensors.size()});
    file.tensors.push_back(std::move(tensor));
  }
  // The format requires the tensors to tile the data exactly: no overlap, no gap.
  std::sort(ranges.begin(), ranges.end(), [](const Range& a, const Range& b) {
    return a.begin != b.begin ? a.begin < b.begin : a.end < b.end;
  });
  std::uint64_t cursor = 0;
  for (std::size_t i = 0; i < ranges.size(); ++i) {
    const Range& r = ranges[i];
    if (r.begin < cursor) {
      return error(absl::StrCat("tensor '", file.tensors[r.index].name, "' overlaps tensor '",
                                file.tensors[ranges[i - 1].index].name, "'"));
    }
    if (r.begin > cursor) {
      return error(absl::StrCat("tensor '", file.tensors[r.index].name, "' starts at data byte ",
                                r.begin, " but the previous data ends at ", cursor,
                                " (gap in the data)"));
    }
    cursor = r.end;
  }
  if (data_size.has_value() && cursor != *data_size) {
    return error(absl::StrCat("the tensors cover ", cursor, " data bytes but the file holds ",
                              *data_size, " (trailing bytes)"));
  }
  Layout layout;
  layout.data_bytes = cursor;
  layout.file.metadata = std::move(file.metadata);
  layout.file.tensors.reserve(ranges.size());
  for (const Range& r : ranges) layout.file.tensors.push_back(std::move(file.tensors[r.index]));
  return layout;
}

// Reads up to `n` bytes into `out`; how many it read (fewer only at the end of the file).
absl::StatusOr<std::uint64_t> ReadUpTo(int fd, char* out, std::uint64_t n,
                                       const std::string& path) {
  std::uint64_t done = 0;
  while (done < n) {
    const std::size_t chunk = static_cast<std::size_t>(std::min<std::uint64_t>(n - done, 1 << 30));
    const ssize_t got = ::read(fd, out + done, chunk);
    if (got < 0) {
      if (errno == EINTR) continue;
      return ErrnoStatus(errno, "cannot read", path);
    }
    if (got == 0) break;
    done += static_cast<std::uint64_t>(got);
  }
  return done;
}

std::string_view FileKind(mode_t mode) {
  if (S_ISDIR(mode)) return "a directory";
  if (S_ISCHR(mode)) return "a character device";
  if (S_ISBLK(mode)) return "a block device";
  if (S_ISSOCK(mode)) return "a socket";
  return "a special file";
}

}  // namespace

absl::StatusOr<SafetensorsFile> ParseSafetensors(std::string_view bytes, std::string_view source) {
  if (bytes.size() < 8) return TooShortForTheLength(bytes.size(), source);
  std::uint64_t header_len = 0;
  std::memcpy(&header_len, bytes.data(), 8);
  PS_RETURN_IF_ERROR(CheckHeaderLength(header_len, bytes.size() - 8, source));
  const std::string_view data = bytes.substr(8 + header_len);
  PS_ASSIGN_OR_RETURN(Layout layout, ParseHeader(bytes.substr(8, header_len), data.size(), source));
  std::uint64_t offset = 0;
  for (HostTensor& t : layout.file.tensors) {
    const std::uint64_t size = static_cast<std::uint64_t>(t.numel() * DTypeSize(t.dtype));
    t.bytes = std::string(data.substr(offset, size));
    offset += size;
  }
  return std::move(layout.file);
}

absl::StatusOr<SafetensorsFile> ReadSafetensors(const std::string& path) {
  PS_ASSIGN_OR_RETURN(ScopedFd file, OpenForReading(path));
  const int fd = file.get();
  struct stat st {};
  if (::fstat(fd, &st) != 0) return ErrnoStatus(errno, "cannot stat", path);
  // A pipe (--data=<(...)) is read as far as its header says; a device or a directory is
  // refused: /dev/zero would otherwise pass as a header of length 0 followed by endless data.
  if (!S_ISREG(st.st_mode) && !S_ISFIFO(st.st_mode)) {
    return FormatError(path, absl::StrCat("is ", Absl(FileKind(st.st_mode)),
                                          ", not a regular file; give a safetensors file (",
                                          Absl(kWhatWorks), ")"));
  }
  // Known for a regular file: every size in the header is checked against it first.
  std::optional<std::uint64_t> size;
  if (S_ISREG(st.st_mode)) size = static_cast<std::uint64_t>(st.st_size);

  char length_bytes[8];
  PS_ASSIGN_OR_RETURN(std::uint64_t got, ReadUpTo(fd, length_bytes, 8, path));
  if (got < 8 || (size.has_value() && *size < 8)) {
    return TooShortForTheLength(size.has_value() ? std::min(*size, got) : got, path);
  }
  std::uint64_t header_len = 0;
  std::memcpy(&header_len, length_bytes, 8);
  PS_RETURN_IF_ERROR(CheckHeaderLength(
      header_len, size.has_value() ? std::optional<std::uint64_t>(*size - 8) : std::nullopt, path));
  std::string header(header_len, '\0');
  PS_ASSIGN_OR_RETURN(got, ReadUpTo(fd, header.data(), header_len, path));
  if (got < header_len) {
    return FormatError(
        path,
        absl::StrCat("truncated: header length is ", header_len, " bytes but only ", got,
                     " follow: a truncated file or not a safetensors file; ", Absl(kWhatWorks)));
  }
  std::optional<std::uint64_t> data_size;
  if (size.has_value()) data_size = *size - 8 - header_len;
  PS_ASSIGN_OR_RETURN(Layout layout, ParseHeader(header, data_size, path));
  header = std::string();

  // The tensors are held whole while their users copy them out: ReadFileToLoad's limit.
  const std::int64_t limit =
      HostMemoryAvailableBytes().value_or(std::numeric_limits<std::int64_t>::max() / 2) / 2;
  if (layout.data_bytes > static_cast<std::uint64_t>(limit)) {
    return absl::ResourceExhaustedError(
        absl::StrCat("cannot read '", path, "': its tensors hold ",
                     HumanBytes(static_cast<std::int64_t>(std::min<std::uint64_t>(
                         layout.data_bytes, std::numeric_limits<std::int64_t>::max()))),
                     ", more than half the host memory available (", HumanBytes(limit),
                     "); give a smaller file"));
  }
  std::uint64_t offset = 0;
  for (HostTensor& t : layout.file.tensors) {
    const std::uint64_t n = static_cast<std::uint64_t>(t.numel() * DTypeSize(t.dtype));
    // The limit follows the machine's memory; a process limit (ulimit -v) can be lower.
    try {
      t.bytes.resize(n);
    } catch (const std::bad_alloc&) {
      return absl::ResourceExhaustedError(absl::StrCat(
          "cannot read '", path, "': out of memory after ", HumanBytes(offset), " of its ",
          HumanBytes(static_cast<std::int64_t>(layout.data_bytes)),
          " of tensors (this process may hold less than the machine has: see ulimit -v); give a "
          "smaller file or raise the process's memory limit"));
    }
    PS_ASSIGN_OR_RETURN(got, ReadUpTo(fd, t.bytes.data(), n, path));
    if (got < n) {  // a pipe that ended early, or a file cut while being read
      return FormatError(
          path, absl::StrCat("truncated: the tensors need ", layout.data_bytes,
                             " data bytes but only ", offset + got, " follow; ", Absl(kWhatWorks)));
    }
    offset += n;
  }
  if (!size.has_value()) {
    char extra;
    PS_ASSIGN_OR_RETURN(got, ReadUpTo(fd, &extra, 1, path));
    if (got != 0) {
      return FormatError(path, absl::StrCat("the tensors cover ", layout.data_bytes,
                                            " data bytes but more follow (trailing bytes)"));
    }
  }
  return std::move(layout.file);
}

absl::StatusOr<std::string> SerializeSafetensors(const SafetensorsFile& file) {
  nlohmann::json header = nlohmann::json::object();
  if (!file.metadata.empty()) {
    nlohmann::json meta = nlohmann::json::object();
    for (const auto& [k, v] : file.metadata) meta[k] = v;
    header[std::string(kMetadataKey)] = meta;
  }
  std::uint64_t offset = 0;
  for (const HostTensor& t : file.tensors) {
    auto tensor_error = [&](const std::string& what) {
      return absl::InvalidArgumentError(absl::StrCat("cannot write tensor '", t.name, "': ", what));
    };
    if (t.name.empty()) return tensor_error("empty name");
    if (t.name == kMetadataKey) return tensor_error("the name is reserved");
    if (header.contains(t.name)) return tensor_error("duplicate name");
    PS_ASSIGN_OR_RETURN(std::int64_t numel, ShapeNumel(t.shape));
    const std::uint64_t expected = static_cast<std::uint64_t>(numel * DTypeSize(t.dtype));
    if (t.bytes.size() != expected) {
      return tensor_error(absl::StrCat("holds ", t.bytes.size(), " bytes but ",
                                       Absl(DTypeName(t.dtype)), " ", ShapeString(t.shape),
                                       " needs ", expected));
    }
    header[t.name] = {{"dtype", std::string(DTypeName(t.dtype))},
                      {"shape", t.shape},
                      {"data_offsets", {offset, offset + expected}}};
    offset += expected;
  }
  std::string text = header.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
  text.append((8 - text.size() % 8) % 8, ' ');
  std::string out(8, '\0');
  const std::uint64_t len = text.size();
  std::memcpy(out.data(), &len, 8);
  out += text;
  out.reserve(out.size() + offset);
  for (const HostTensor& t : file.tensors) out += t.bytes;
  return out;
}

absl::Status WriteSafetensors(const std::string& path, const SafetensorsFile& file) {
  PS_ASSIGN_OR_RETURN(std::string bytes, SerializeSafetensors(file));
  return WriteFileAtomic(path, bytes);
}

}  // namespace pipesched::model
