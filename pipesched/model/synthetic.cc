// Synthetic data: Gaussian inputs labelled by a fixed random teacher network.
#include "pipesched/model/synthetic.h"

#include <cmath>
#include <string>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "pipesched/base/status.h"
#include "pipesched/model/mlp.h"

namespace pipesched::model {
namespace {

// Generator streams, far from the parameter-init streams (2 * layer + {0, 1}).
constexpr std::uint64_t kStreamX = 1ull << 40;
constexpr std::uint64_t kStreamTeacher1 = kStreamX + 1;
constexpr std::uint64_t kStreamTeacher2 = kStreamX + 2;
constexpr std::uint64_t kStreamTeacherBias = kStreamX + 3;

}  // namespace

absl::StatusOr<Dataset> MakeSynthetic(const SyntheticConfig& config) {
  const struct {
    const char* name;
    std::int64_t value;
  } fields[] = {{"d_in", config.d_in},
                {"num_classes", config.num_classes},
                {"num_samples", config.num_samples},
                {"teacher_hidden", config.teacher_hidden}};
  for (const auto& f : fields) {
    if (f.value < 1) {
      return absl::InvalidArgumentError(
          absl::StrCat("synthetic data ", f.name, " must be at least 1, got ", f.value));
    }
  }
  const int d = config.d_in;
  const int h = config.teacher_hidden;
  const int c = config.num_classes;
  const std::uint64_t seed = config.seed;
  // Teacher: tanh(x W1^T / sqrt(d)) W2^T / sqrt(h) + b2, in double.
  std::vector<double> w1(static_cast<std::size_t>(h) * d), w2(static_cast<std::size_t>(c) * h),
      b2(c);
  for (std::size_t i = 0; i < w1.size(); ++i) {
    w1[i] = CounterNormal(seed, kStreamTeacher1, i) / std::sqrt(static_cast<double>(d));
  }
  for (std::size_t i = 0; i < w2.size(); ++i) {
    w2[i] = CounterNormal(seed, kStreamTeacher2, i) / std::sqrt(static_cast<double>(h));
  }
  for (int i = 0; i < c; ++i) b2[i] = 0.1 * CounterNormal(seed, kStreamTeacherBias, i);

  Dataset data;
  data.d_in = d;
  data.num_classes = c;
  data.x.resize(static_cast<std::size_t>(config.num_samples) * d);
  data.y.resize(config.num_samples);
  std::vector<double> hidden(h);
  for (std::int64_t s = 0; s < config.num_samples; ++s) {
    float* x = data.x.data() + s * d;
    for (int k = 0; k < d; ++k) {
      x[k] = CounterNormal(seed, kStreamX, static_cast<std::uint64_t>(s) * d + k);
    }
    for (int j = 0; j < h; ++j) {
      double acc = 0.0;
      for (int k = 0; k < d; ++k) acc += w1[static_cast<std::size_t>(j) * d + k] * x[k];
      hidden[j] = std::tanh(acc);
    }
    int best = 0;
    double best_logit = 0.0;
    for (int o = 0; o < c; ++o) {
      double acc = b2[o];
      for (int j = 0; j < h; ++j) acc += w2[static_cast<std::size_t>(o) * h + j] * hidden[j];
      if (o == 0 || acc > best_logit) {
        best = o;
        best_logit = acc;
      }
    }
    data.y[s] = best;
  }
  return data;
}

absl::Status SaveDataset(const std::string& path, const Dataset& data) {
  SafetensorsFile file;
  file.tensors.push_back(HostTensor::F32("x", {data.num_samples(), data.d_in}, data.x));
  file.tensors.push_back(HostTensor::I32("y", {data.num_samples()}, data.y));
  file.metadata["num_classes"] = absl::StrCat(data.num_classes);
  return WriteSafetensors(path, file);
}

absl::StatusOr<Dataset> LoadDataset(const std::string& path) {
  PS_ASSIGN_OR_RETURN(SafetensorsFile file, ReadSafetensors(path));
  auto error = [&](const std::string& what) {
    return absl::InvalidArgumentError(absl::StrCat("data set '", path, "': ", what));
  };
  absl::StatusOr<const HostTensor*> x = file.Find("x");
  if (!x.ok()) return error(std::string(x.status().message()));
  absl::StatusOr<const HostTensor*> y = file.Find("y");
  if (!y.ok()) return error(std::string(y.status().message()));
  if ((*x)->shape.size() != 2) {
    return error(absl::StrCat("tensor 'x' must be 2-D (samples, features), has ",
                              (*x)->shape.size(), " dimensions"));
  }
  if ((*y)->shape.size() != 1) {
    return error(
        absl::StrCat("tensor 'y' must be 1-D (samples), has ", (*y)->shape.size(), " dimensions"));
  }
  if ((*x)->shape[0] != (*y)->shape[0]) {
    return error(
        absl::StrCat("tensor 'x' has ", (*x)->shape[0], " samples but 'y' has ", (*y)->shape[0]));
  }
  if ((*x)->shape[0] < 1 || (*x)->shape[1] < 1) return error("tensor 'x' is empty");
  Dataset data;
  absl::StatusOr<std::vector<float>> xs = (*x)->ToFloats();
  if (!xs.ok()) return error(std::string(xs.status().message()));
  absl::StatusOr<std::vector<std::int32_t>> ys = (*y)->ToInt32s();
  if (!ys.ok()) return error(std::string(ys.status().message()));
  data.x = std::move(*xs);
  data.y = std::move(*ys);
  data.d_in = static_cast<int>((*x)->shape[1]);
  for (std::size_t i = 0; i < data.x.size(); ++i) {
    if (!std::isfinite(data.x[i])) {
      return error(absl::StrCat("tensor 'x' holds ", data.x[i], " at sample ", i / data.d_in,
                                ", feature ", i % data.d_in, ": every input must be finite"));
    }
  }
  int max_label = 0;
  for (std::size_t i = 0; i < data.y.size(); ++i) {
    if (data.y[i] < 0) {
      return error(absl::StrCat("label ", data.y[i], " of sample ", i, " is negative"));
    }
    max_label = std::max(max_label, data.y[i]);
  }
  data.num_classes = max_label + 1;
  if (auto it = file.metadata.find("num_classes"); it != file.metadata.end()) {
    int n = 0;
    if (!absl::SimpleAtoi(it->second, &n) || n < 1) {
      return error(
          absl::StrCat("metadata num_classes '", it->second, "' is not a positive integer"));
    }
    if (n <= max_label) {
      return error(absl::StrCat("label ", max_label, " is out of range for num_classes ", n));
    }
    data.num_classes = n;
  }
  return data;
}

}  // namespace pipesched::model
