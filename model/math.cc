// CreateMath: one table from backend kind to implementation.
#include "model/math.h"

#include "absl/strings/str_cat.h"
#include "base/strings.h"
#include "model/math_impl.h"

namespace pipesched::model {
namespace {

struct MathFactory {
  runtime::BackendKind kind;
  absl::StatusOr<std::unique_ptr<Math>> (*create)(runtime::Device&);
};

constexpr MathFactory kFactories[] = {
    {runtime::BackendKind::kHost, &internal::CreateHostMath},
    {runtime::BackendKind::kCuda, &internal::CreateCudaMath},
};

}  // namespace

#ifndef PIPESCHED_WITH_CUDA
absl::StatusOr<std::unique_ptr<Math>> internal::CreateCudaMath(runtime::Device& device) {
  return absl::UnavailableError(absl::StrCat("cannot run the model on ", device.description(),
                                             ": pipesched was built without CUDA"));
}
#endif

absl::StatusOr<std::unique_ptr<Math>> CreateMath(runtime::Device& device) {
  for (const MathFactory& factory : kFactories) {
    if (factory.kind == device.kind()) return factory.create(device);
  }
  return absl::UnimplementedError(
      absl::StrCat("no model math for backend ", Absl(runtime::BackendName(device.kind()))));
}

}  // namespace pipesched::model
