// CreateMath and PrepareMath: one table from backend kind to implementation.
#include "pipesched/model/math.h"

#include "absl/strings/str_cat.h"
#include "pipesched/base/strings.h"
#include "pipesched/model/math_impl.h"

namespace pipesched::model {
namespace {

struct MathFactory {
  runtime::BackendKind kind;
  absl::StatusOr<std::unique_ptr<Math>> (*create)(runtime::Device&);
  absl::Status (*prepare)(int concurrent_streams);
};

absl::Status NothingToPrepare(int) { return absl::OkStatus(); }

constexpr MathFactory kFactories[] = {
    {runtime::BackendKind::kHost, &internal::CreateHostMath, &internal::PrepareHostMath},
    {runtime::BackendKind::kCuda, &internal::CreateCudaMath, &NothingToPrepare},
};

const MathFactory* FactoryFor(runtime::BackendKind kind) {
  for (const MathFactory& factory : kFactories) {
    if (factory.kind == kind) return &factory;
  }
  return nullptr;
}

absl::Status NoMathFor(runtime::BackendKind kind) {
  return absl::UnimplementedError(
      absl::StrCat("no model math for backend ", Absl(runtime::BackendName(kind))));
}

}  // namespace

#ifndef PIPESCHED_WITH_CUDA
absl::StatusOr<std::unique_ptr<Math>> internal::CreateCudaMath(runtime::Device& device) {
  return absl::UnavailableError(absl::StrCat("cannot run the model on ", device.description(),
                                             ": pipesched was built without CUDA"));
}
#endif

absl::StatusOr<std::unique_ptr<Math>> CreateMath(runtime::Device& device) {
  const MathFactory* factory = FactoryFor(device.kind());
  if (factory == nullptr) return NoMathFor(device.kind());
  return factory->create(device);
}

absl::Status PrepareMath(runtime::BackendKind kind, int concurrent_streams) {
  const MathFactory* factory = FactoryFor(kind);
  if (factory == nullptr) return NoMathFor(kind);
  return factory->prepare(concurrent_streams);
}

}  // namespace pipesched::model
