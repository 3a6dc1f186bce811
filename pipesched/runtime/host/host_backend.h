// The host backend: CUDA's stream/event semantics emulated with threads, so that
// everything above the seam is tested without a GPU. Each Stream is one worker thread
// running its work in order; each Event is a generation counter; each Device is an
// independent memory account, and several devices in one process stand for several GPUs.
// Not a performance backend: it measures order, overlap and memory, not FLOPs.
#pragma once

#include <memory>

#include "absl/status/statusor.h"
#include "pipesched/runtime/runtime.h"

namespace pipesched::runtime {

absl::StatusOr<std::unique_ptr<Backend>> CreateHostBackend(const BackendOptions& options);

}  // namespace pipesched::runtime
