// FNV-1a, 64 bits: a hash that is the same in every process and on every run (absl::Hash
// is seeded per process), for checksums that are written down or compared between
// processes: checkpoints (stages/checkpoint.h), the agreement checks of a job of several
// processes (stages/trainer.h). Not for hash tables, not against an adversary.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string_view>

namespace pipesched {

class Fnv1a64 {
 public:
  void Add(std::string_view bytes) {
    for (unsigned char c : bytes) {
      hash_ ^= c;
      hash_ *= 0x100000001b3ULL;
    }
  }
  void Add(const void* data, std::size_t bytes) {
    Add(std::string_view(static_cast<const char*>(data), bytes));
  }
  // `bytes` and a NUL: consecutive fields cannot run into each other.
  void AddField(std::string_view bytes) {
    Add(bytes);
    Add(std::string_view("\0", 1));
  }
  std::uint64_t value() const { return hash_; }

 private:
  std::uint64_t hash_ = 0xcbf29ce484222325ULL;
};

}  // namespace pipesched
