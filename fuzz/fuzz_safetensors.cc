// libFuzzer target: bytes -> ParseSafetensors -> every tensor's accessors -> Serialize ->
// ParseSafetensors again. Holds the reader to: no crash, each tensor's bytes match its
// shape and dtype, and a file it accepts and the writer re-serializes reads back the same.
// The same bytes as a file (a memfd, a regular file) through ReadSafetensors, which reads
// header first: it accepts exactly what ParseSafetensors accepts, with the same tensors.
#include <sys/mman.h>
#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include "fuzz/fuzz_check.h"
#include "pipesched/model/safetensors.h"

namespace pipesched::model {
namespace {

// The bytes as a regular file's contents: one memfd, rewritten for each input.
absl::StatusOr<SafetensorsFile> ReadAsFile(std::string_view bytes) {
  static const int fd = ::memfd_create("fuzz-safetensors", 0);
  PS_FUZZ_CHECK(fd >= 0, "memfd_create failed");
  PS_FUZZ_CHECK(::ftruncate(fd, 0) == 0, "ftruncate failed");
  for (std::size_t done = 0; done < bytes.size();) {
    const ssize_t n = ::pwrite(fd, bytes.data() + done, bytes.size() - done, done);
    PS_FUZZ_CHECK(n > 0, "pwrite failed");
    done += static_cast<std::size_t>(n);
  }
  return ReadSafetensors("/proc/self/fd/" + std::to_string(fd));
}

// `b` (read another way) holds `a`'s tensors, in order, and its metadata.
void CheckSame(const SafetensorsFile& a, const SafetensorsFile& b, const std::string& what) {
  PS_FUZZ_CHECK(b.tensors.size() == a.tensors.size(), what + ": tensor count differs");
  for (std::size_t i = 0; i < a.tensors.size(); ++i) {
    const HostTensor& x = a.tensors[i];
    const HostTensor& y = b.tensors[i];
    PS_FUZZ_CHECK(
        x.name == y.name && x.dtype == y.dtype && x.shape == y.shape && x.bytes == y.bytes,
        what + ": " + x.name);
  }
  PS_FUZZ_CHECK(b.metadata == a.metadata, what + ": metadata differs");
}

void FuzzOne(std::string_view bytes) {
  absl::StatusOr<SafetensorsFile> file = ParseSafetensors(bytes, "fuzz-input");
  absl::StatusOr<SafetensorsFile> read = ReadAsFile(bytes);
  PS_FUZZ_CHECK(read.ok() == file.ok(), file.ok() ? read.status() : file.status());
  if (!file.ok()) return;
  CheckSame(*file, *read, "ReadSafetensors");
  for (const HostTensor& t : file->tensors) {
    PS_FUZZ_CHECK(static_cast<std::int64_t>(t.bytes.size()) == t.numel() * DTypeSize(t.dtype),
                  t.name);
    PS_FUZZ_CHECK(file->Find(t.name).ok(), t.name);
    if (t.dtype == DType::kF32) {
      absl::StatusOr<std::vector<float>> v = t.ToFloats();
      PS_FUZZ_CHECK(v.ok() && static_cast<std::int64_t>(v->size()) == t.numel(), t.name);
    } else {
      (void)t.ToInt32s();  // may reject I64 values beyond int32, never crash
    }
  }

  absl::StatusOr<std::string> out = SerializeSafetensors(*file);
  if (!out.ok()) return;  // e.g. a name the writer refuses
  absl::StatusOr<SafetensorsFile> again = ParseSafetensors(*out, "fuzz-reserialized");
  PS_FUZZ_CHECK(again.ok(), again.status());
  CheckSame(*file, *again, "the re-serialized file");
}

}  // namespace
}  // namespace pipesched::model

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  pipesched::model::FuzzOne(std::string_view(reinterpret_cast<const char*>(data), size));
  return 0;
}
