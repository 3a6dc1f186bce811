// Partitioning (stages/partition.h).
#include "pipesched/stages/partition.h"

#include <limits>
#include <numeric>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace pipesched::stages {

absl::StatusOr<std::vector<LayerRange>> PartitionBalanced(const std::vector<double>& costs,
                                                          int num_chunks) {
  const int n = static_cast<int>(costs.size());
  if (num_chunks < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("the number of chunks must be at least 1, not ", num_chunks));
  }
  if (n < num_chunks) {
    return absl::InvalidArgumentError(absl::StrCat(
        n, " layers cannot fill ", num_chunks, " chunks: every chunk needs at least one layer"));
  }
  for (int i = 0; i < n; ++i) {
    if (!(costs[i] >= 0)) {
      return absl::InvalidArgumentError(
          absl::StrCat("layer ", i, " has cost ", costs[i], "; costs must be >= 0"));
    }
  }
  std::vector<double> prefix(n + 1, 0);
  for (int i = 0; i < n; ++i) prefix[i + 1] = prefix[i] + costs[i];
  // best[k][i]: the smallest possible largest cost splitting layers [0, i) into k chunks;
  // cut[k][i]: where the last of those chunks starts.
  constexpr double kInf = std::numeric_limits<double>::infinity();
  std::vector<std::vector<double>> best(num_chunks + 1, std::vector<double>(n + 1, kInf));
  std::vector<std::vector<int>> cut(num_chunks + 1, std::vector<int>(n + 1, 0));
  best[0][0] = 0;
  for (int k = 1; k <= num_chunks; ++k) {
    for (int i = k; i <= n - (num_chunks - k); ++i) {
      for (int j = k - 1; j < i; ++j) {
        const double cost = std::max(best[k - 1][j], prefix[i] - prefix[j]);
        // Strictly better only, with a relative slack so that float noise in the prefix
        // sums does not decide ties.
        if (cost < best[k][i] * (1 - 1e-12)) {
          best[k][i] = cost;
          cut[k][i] = j;
        }
      }
    }
  }
  std::vector<LayerRange> ranges(num_chunks);
  int end = n;
  for (int k = num_chunks; k >= 1; --k) {
    ranges[k - 1] = LayerRange{.first = cut[k][end], .last = end};
    end = cut[k][end];
  }
  return ranges;
}

absl::StatusOr<std::vector<LayerRange>> PartitionExplicit(
    int num_layers, int num_chunks, const std::vector<int>& layers_per_chunk) {
  if (static_cast<int>(layers_per_chunk.size()) != num_chunks) {
    return absl::InvalidArgumentError(
        absl::StrCat("the partition lists ", layers_per_chunk.size(), " chunk sizes (",
                     absl::StrJoin(layers_per_chunk, ","), ") but the pipeline has ", num_chunks,
                     " chunks; give one count per chunk"));
  }
  std::vector<LayerRange> ranges;
  int first = 0;
  for (int c = 0; c < num_chunks; ++c) {
    if (layers_per_chunk[c] < 1) {
      return absl::InvalidArgumentError(
          absl::StrCat("chunk ", c, " of the partition (", absl::StrJoin(layers_per_chunk, ","),
                       ") has ", layers_per_chunk[c], " layers; every chunk needs at least one"));
    }
    // Checked before the sum: 2147483647,2147483647,6 wrapped around to 4 layers.
    if (layers_per_chunk[c] > num_layers - first) {
      return absl::InvalidArgumentError(
          absl::StrCat("the partition (", absl::StrJoin(layers_per_chunk, ","), ") gives chunk ", c,
                       " ", layers_per_chunk[c], " layers but only ", num_layers - first,
                       " of the model's ", num_layers, " are left for it"));
    }
    ranges.push_back(LayerRange{.first = first, .last = first + layers_per_chunk[c]});
    first += layers_per_chunk[c];
  }
  if (first != num_layers) {
    return absl::InvalidArgumentError(
        absl::StrCat("the partition (", absl::StrJoin(layers_per_chunk, ","), ") covers ", first,
                     " layers but the model has ", num_layers));
  }
  return ranges;
}

absl::StatusOr<std::vector<LayerRange>> PartitionMlp(const model::MlpConfig& config, int num_chunks,
                                                     const std::vector<int>& layers_per_chunk) {
  absl::Status valid = config.Validate();
  if (!valid.ok()) return valid;
  const int n = config.num_model_layers();
  if (num_chunks < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("the number of chunks must be at least 1, not ", num_chunks));
  }
  if (n < num_chunks) {
    return absl::InvalidArgumentError(absl::StrCat(
        config.num_layers, " blocks + head = ", n, " layers cannot fill ", num_chunks,
        " chunks (stages x virtual stages): every chunk needs at least one layer; use at least ",
        num_chunks - 1, " blocks or fewer chunks"));
  }
  if (!layers_per_chunk.empty()) {
    absl::StatusOr<std::vector<LayerRange>> ranges =
        PartitionExplicit(n, num_chunks, layers_per_chunk);
    if (!ranges.ok()) {
      return absl::InvalidArgumentError(
          absl::StrCat(ranges.status().message(), " (", config.num_layers,
                       " blocks + head; the head is the last layer)"));
    }
    return ranges;
  }
  std::vector<double> costs(n);
  for (int layer = 0; layer < n; ++layer) {
    model::LayerFlops f = model::FlopsPerSample(config, layer, layer + 1);
    costs[layer] = f.forward + f.backward_input + f.backward_weight;
  }
  return PartitionBalanced(costs, num_chunks);
}

std::string PartitionToString(const std::vector<LayerRange>& ranges) {
  return absl::StrJoin(ranges, " ", [](std::string* out, const LayerRange& r) {
    absl::StrAppend(out, "[", r.first, ",", r.last, ")");
  });
}

}  // namespace pipesched::stages
