// Fixed-width records for the processes of one job to send each other (a split
// pipeline's step rows, its stages' tensors): 8-byte integers and doubles in native byte
// order (every process runs one build) and length-prefixed text. A reader that runs out
// of bytes, or meets a length that cannot be, stops reading and says so (ok()).
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>
#include <string_view>

namespace pipesched {

class ByteWriter {
 public:
  void Int(std::int64_t v) { Add(&v, sizeof v); }
  void Real(double v) { Add(&v, sizeof v); }
  void Text(std::string_view v) {
    Int(static_cast<std::int64_t>(v.size()));
    out_.append(v);
  }
  std::string& bytes() { return out_; }

 private:
  void Add(const void* data, std::size_t n) { out_.append(static_cast<const char*>(data), n); }
  std::string out_;
};

class ByteReader {
 public:
  explicit ByteReader(std::string_view in) : in_(in) {}
  bool ok() const { return ok_; }
  bool empty() const { return in_.empty(); }
  void Fail() { ok_ = false; }
  std::int64_t Int() {
    std::int64_t v = 0;
    Take(&v, sizeof v);
    return v;
  }
  double Real() {
    double v = 0;
    Take(&v, sizeof v);
    return v;
  }
  std::string Text() {
    const std::int64_t n = Int();
    if (!ok_ || n < 0 || static_cast<std::uint64_t>(n) > in_.size()) {
      ok_ = false;
      return {};
    }
    std::string v(in_.substr(0, static_cast<std::size_t>(n)));
    in_.remove_prefix(static_cast<std::size_t>(n));
    return v;
  }
  // A count of items of at least `item_bytes` each that the rest can hold (0 and not ok
  // otherwise).
  std::int64_t Count(std::size_t item_bytes) {
    const std::int64_t n = Int();
    if (!ok_ || n < 0 || static_cast<std::uint64_t>(n) > in_.size() / item_bytes) ok_ = false;
    return ok_ ? n : 0;
  }

 private:
  void Take(void* data, std::size_t n) {
    if (!ok_ || in_.size() < n) {
      ok_ = false;
      return;
    }
    std::memcpy(data, in_.data(), n);
    in_.remove_prefix(n);
  }
  std::string_view in_;
  bool ok_ = true;
};

}  // namespace pipesched
