// A synthetic classification data set that makes training meaningful: x ~ N(0, 1) of
// shape (N, d_in), labels = argmax of a fixed random teacher network
// (d_in -> teacher_hidden, tanh, -> num_classes) applied to x. Deterministic from the
// seed; sample i depends only on (seed, i), so any slice is generated identically.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "pipesched/model/safetensors.h"

namespace pipesched::model {

struct SyntheticConfig {
  int d_in = 64;
  int num_classes = 10;
  std::int64_t num_samples = 1024;
  int teacher_hidden = 64;
  std::uint64_t seed = 0;
};

struct Dataset {
  int d_in = 0;
  int num_classes = 0;
  std::vector<float> x;         // (num_samples, d_in)
  std::vector<std::int32_t> y;  // (num_samples), in [0, num_classes)
  std::int64_t num_samples() const { return static_cast<std::int64_t>(y.size()); }
};

// InvalidArgument naming the field when a size is < 1.
absl::StatusOr<Dataset> MakeSynthetic(const SyntheticConfig& config);

// Tensors "x" (F32, (N, d_in)) and "y" (I32, (N)) plus metadata num_classes; an atomic
// write (WriteSafetensors), with its errors.
absl::Status SaveDataset(const std::string& path, const Dataset& data);
// Reads "x" (F32, 2-D) and "y" (I32 or I64, 1-D, same N). num_classes comes from the
// metadata "num_classes" if present, else max label + 1. Errors name the file and tensor:
// NotFound for the file or a missing tensor, InvalidArgument for a wrong dtype or shape.
absl::StatusOr<Dataset> LoadDataset(const std::string& path);

}  // namespace pipesched::model
