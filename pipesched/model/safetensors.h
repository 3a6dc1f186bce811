// Host tensors and the safetensors file format (what PyTorch users already write with
// safetensors.torch.save_file): 8-byte little-endian header length N, N bytes of JSON
//   {"__metadata__": {"k": "v"}, "name": {"dtype": "F32", "shape": [2, 3],
//    "data_offsets": [begin, end]}, ...}
// then the raw little-endian data; offsets are relative to the end of the header. Only
// F32, I32 and I64 are supported. Used for data sets (x, y) and parameter save/load.
// Every error names the file (or source), the tensor or key, and what is wrong.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace pipesched::model {

enum class DType { kF32, kI32, kI64 };

std::string_view DTypeName(DType dtype);  // "F32", "I32", "I64"
std::int64_t DTypeSize(DType dtype);

// A named tensor in host memory; `bytes` holds numel() * DTypeSize(dtype) bytes.
struct HostTensor {
  std::string name;
  DType dtype = DType::kF32;
  std::vector<std::int64_t> shape;
  std::string bytes;

  static HostTensor F32(std::string name, std::vector<std::int64_t> shape,
                        const std::vector<float>& values);
  static HostTensor I32(std::string name, std::vector<std::int64_t> shape,
                        const std::vector<std::int32_t>& values);
  static HostTensor I64(std::string name, std::vector<std::int64_t> shape,
                        const std::vector<std::int64_t>& values);

  std::int64_t numel() const;
  // F32 only; InvalidArgument naming the tensor and its dtype otherwise.
  absl::StatusOr<std::vector<float>> ToFloats() const;
  // I32, or I64 whose values fit in int32 (labels saved by PyTorch are int64).
  absl::StatusOr<std::vector<std::int32_t>> ToInt32s() const;
};

struct SafetensorsFile {
  std::vector<HostTensor> tensors;  // in file order (by data offset)
  std::map<std::string, std::string> metadata;

  // NotFound naming `name` and the tensors present.
  absl::StatusOr<const HostTensor*> Find(std::string_view name) const;
};

// `source` names the bytes in error messages (usually the path). InvalidArgument
// "safetensors '<source>': ..." for a header length of 0, above the format's limit of
// 10^8 bytes or past the end ("not a safetensors file" / "truncated", with what would
// work), bad header JSON, an unsupported dtype, or offsets that do not match the shape or
// the data.
absl::StatusOr<SafetensorsFile> ParseSafetensors(std::string_view bytes, std::string_view source);
// Reads a file in the order of its checks, so that a bad one fails before its data is
// read: the 8-byte header length (against the file's size), the header (against the data
// section's size), then the data. Errors as ParseSafetensors, and: NotFound /
// PermissionDenied / Internal for the file; InvalidArgument for a directory or a device
// (/dev/zero); ResourceExhausted when the tensors hold more than half the host memory
// available (as ReadFileToLoad) or the allocation fails. A pipe (--data=<(...)) is read
// as far as its header says, then must end.
absl::StatusOr<SafetensorsFile> ReadSafetensors(const std::string& path);

// InvalidArgument on duplicate or empty names, a name "__metadata__", or bytes that do not
// match the shape. The header is padded with spaces to a multiple of 8 bytes.
absl::StatusOr<std::string> SerializeSafetensors(const SafetensorsFile& file);
// Atomic (WriteFileAtomic): a failed write leaves any previous file untouched.
absl::Status WriteSafetensors(const std::string& path, const SafetensorsFile& file);

}  // namespace pipesched::model
