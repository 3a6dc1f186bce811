// Partitioning a model of N layers into P x V contiguous chunks (virtual stages), one
// per StageWork. For the built-in MLP the layers are its L blocks plus the head
// (layer L), so N = L + 1. Chunk c holds layers [first, last).
#pragma once

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "pipesched/model/mlp.h"

namespace pipesched::stages {

struct LayerRange {
  int first = 0;
  int last = 0;  // exclusive
  int size() const { return last - first; }
  friend bool operator==(const LayerRange&, const LayerRange&) = default;
};

// Contiguous non-empty ranges over layers 0..costs.size()-1 that minimise the largest
// chunk's cost (the pipeline's slowest stage); ties go to the earliest split.
// InvalidArgument when num_chunks < 1, a cost is negative, or there are fewer layers
// than chunks.
absl::StatusOr<std::vector<LayerRange>> PartitionBalanced(const std::vector<double>& costs,
                                                          int num_chunks);

// Chunk c gets layers_per_chunk[c] layers, in order. InvalidArgument unless there is one
// count per chunk, each >= 1, summing to num_layers.
absl::StatusOr<std::vector<LayerRange>> PartitionExplicit(int num_layers, int num_chunks,
                                                          const std::vector<int>& layers_per_chunk);

// The MLP split into num_chunks chunks: balanced by FLOPs per sample (forward + both
// backward halves) when layers_per_chunk is empty, else explicit. Errors speak of
// blocks and the head ("4 blocks + head = 5 layers cannot fill 8 chunks (P=4 x V=2)").
absl::StatusOr<std::vector<LayerRange>> PartitionMlp(const model::MlpConfig& config, int num_chunks,
                                                     const std::vector<int>& layers_per_chunk = {});

// "[0,2) [2,4) [4,5)"
std::string PartitionToString(const std::vector<LayerRange>& ranges);

}  // namespace pipesched::stages
