// Embedding pipesched: a model of your own, split in two pipeline stages, trained by
// pipesched's Executor on a 1F1B schedule. This is what a user with their own training
// code writes; nothing here comes from the built-in MLP.
//
// The model is a small regression net, x: (B, 4) -> y: (B, 1):
//   stage 0:  h = tanh(x W0^T + b0)          W0: (16, 4)   h: (B, 16)
//   stage 1:  y = h W1^T + b1                W1: (1, 16)   y: (B, 1)
//             loss = mean over the batch of 0.5 (y - t)^2
// Each stage is a DenseStage (a StageWork): it owns its parameters and gradients, and
// each callback enqueues one closure of plain loops on the stream it is given
// (Stream::EnqueueHost) and returns at once. That is the host backend's way; on CUDA the
// same callbacks would launch kernels on runtime::CudaStreamOf(stream).
//
// Usage: embed_example [--split] [trace.json]   (default: embed_trace.json)
// Prints one line per step with the loss (it falls: the same global batch every step),
// then writes the last step's measured timeline as a Chrome / Perfetto trace.
//
// Data parallel across processes: `pipesched launch --processes=2 -- embed_example`
// starts two, each told its job in the environment (comm::CreateBootstrapFromEnvironment);
// each trains on its own share of the data, the executor averages the stages' gradients
// over both, and process 0 writes the trace.
// Pipeline across processes: `pipesched launch --processes=2 -- embed_example --split`
// gives each process one of the two stages instead (ExecutorOptions::pipeline): the
// activations and gradients between them go as the bootstrap's messages, both train on
// the whole batch and print the same losses as one process alone, and process 0 writes
// the trace of both ranks. With more processes than stages (`launch --processes=4 --
// embed_example --split`), comm::SplitJob makes pipelines of two processes that are
// data-parallel replicas of each other: each pipeline trains on its own share, and
// process 0 prints the losses the two-process data-parallel job prints.
#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "pipesched/pipesched.h"

namespace {

using pipesched::runtime::Buffer;
using pipesched::runtime::Device;
using pipesched::runtime::Stream;
using pipesched::stages::ActivationStash;
using pipesched::stages::GradientSpan;
using pipesched::stages::MicrobatchIO;

constexpr int kInputs = 4;   // features of x
constexpr int kHidden = 16;  // width of h
constexpr int kBatch = 8;    // B: samples per micro-batch
constexpr float kLr = 0.2f;  // plain SGD

// Deterministic pseudo-random numbers in [-1, 1) (no global state: a pure function).
float Uniform(std::uint64_t key) {
  key = (key ^ (key >> 30)) * 0xbf58476d1ce4e5b9ULL;
  key = (key ^ (key >> 27)) * 0x94d049bb133111ebULL;
  key ^= key >> 31;
  return static_cast<float>(key >> 40) / static_cast<float>(1 << 23) - 1.0f;
}

// What one micro-batch keeps from its F to its backward: the stage input and, after F,
// the stage's activation (tanh output, or the loss residual y - t on the last stage),
// overwritten by the backward with the gradient w.r.t. the pre-activation.
class DenseStash final : public ActivationStash {
 public:
  explicit DenseStash(Buffer buffer) : buffer_(std::move(buffer)) {}
  float* data() const { return buffer_.as<float>(); }
  std::int64_t bytes() const override { return static_cast<std::int64_t>(buffer_.size()); }
  absl::Status FreeAsync(Stream& stream) override { return buffer_.FreeAsync(stream); }

 private:
  Buffer buffer_;
};

// One dense layer as a pipeline stage: z = x W^T + b, then tanh (hidden stage) or the
// mean squared error against the targets (last stage).
class DenseStage final : public pipesched::stages::StageWork {
 public:
  // Parameters are set synchronously here; everything later is enqueued on streams.
  static absl::StatusOr<std::unique_ptr<DenseStage>> Create(int in, int out, bool last,
                                                            std::uint64_t seed, Device& device) {
    if (device.kind() != pipesched::runtime::BackendKind::kHost) {
      return absl::UnimplementedError("DenseStage computes with host loops: host backend only");
    }
    auto stage = std::unique_ptr<DenseStage>(new DenseStage(in, out, last, device));
    const std::size_t n = stage->num_weights();
    // params_ = [W (out, in)][b (out)][dW][db]
    absl::StatusOr<std::unique_ptr<Stream>> setup = device.CreateStream("dense setup");
    if (!setup.ok()) return setup.status();
    absl::StatusOr<Buffer> params = device.Allocate(2 * n * sizeof(float), **setup);
    if (!params.ok()) return params.status();
    stage->params_ = std::move(params).value();
    std::vector<float> init(2 * n, 0.0f);
    const float scale = 1.0f / std::sqrt(static_cast<float>(in));  // nn.Linear's bound
    for (std::size_t i = 0; i < n; ++i) init[i] = scale * Uniform(seed * 1000003 + i);
    // The allocation is stream-ordered: let it happen before the synchronous copy.
    if (absl::Status s = (*setup)->Synchronize(); !s.ok()) return s;
    if (absl::Status s =
            device.CopyFromHost(stage->params_.data(), init.data(), init.size() * sizeof(float));
        !s.ok()) {
      return s;
    }
    return stage;
  }

  std::size_t input_bytes() const override { return kBatch * in_ * sizeof(float); }
  std::size_t output_bytes() const override { return last_ ? 0 : kBatch * out_ * sizeof(float); }
  std::size_t target_bytes() const override { return last_ ? kBatch * sizeof(float) : 0; }
  std::int64_t stash_bytes() const override {
    return static_cast<std::int64_t>(kBatch * (in_ + out_) * sizeof(float));
  }
  std::int64_t num_params() const override { return static_cast<std::int64_t>(num_weights()); }

  absl::StatusOr<std::unique_ptr<ActivationStash>> AllocateStash(Stream& stream) override {
    absl::StatusOr<Buffer> buffer =
        device_.Allocate(static_cast<std::size_t>(stash_bytes()), stream);
    if (!buffer.ok()) return buffer.status();
    return std::unique_ptr<ActivationStash>(new DenseStash(std::move(buffer).value()));
  }

  // x: (B, in) -> out: (B, out); the last stage writes the micro-batch's loss instead.
  absl::Status Forward(const MicrobatchIO& io, Stream& stream) override {
    // Copy what the closure needs now: `io` itself does not outlive this call, the
    // buffers it points to live until the enqueued work has run.
    const auto* x = static_cast<const float*>(io.input);
    auto* y = static_cast<float*>(io.output);
    const auto* t = static_cast<const float*>(io.targets);
    float* loss = io.loss;
    float* stash = static_cast<DenseStash*>(io.stash)->data();  // [x (B, in)][a (B, out)]
    const float* w = params_.as<float>();
    const float* b = w + in_ * out_;
    const int in = in_, out = out_;
    const bool last = last_;
    return stream.EnqueueHost([=]() -> absl::Status {
      std::memcpy(stash, x, sizeof(float) * kBatch * in);
      float* a = stash + kBatch * in;
      double sum = 0;
      for (int r = 0; r < kBatch; ++r) {
        for (int o = 0; o < out; ++o) {
          float z = b[o];
          for (int i = 0; i < in; ++i) z += x[r * in + i] * w[o * in + i];
          if (last) {
            a[r * out + o] = z - t[r];  // the residual; the backward turns it into dz
            sum += 0.5 * static_cast<double>(z - t[r]) * (z - t[r]);
          } else {
            a[r * out + o] = y[r * out + o] = std::tanh(z);
          }
        }
      }
      if (last) *loss = static_cast<float>(sum / kBatch);
      return absl::OkStatus();
    });
  }

  // I: dz from the stash (and grad_output), then dx = dz W unless this is the first stage.
  absl::Status BackwardInput(const MicrobatchIO& io, Stream& stream) override {
    const auto* dy = static_cast<const float*>(io.grad_output);  // null on the last stage
    auto* dx = static_cast<float*>(io.grad_input);               // null on the first stage
    float* a = static_cast<DenseStash*>(io.stash)->data() + kBatch * in_;
    const float* w = params_.as<float>();
    // The last stage starts from d(loss_scale * loss)/dz = loss_scale * (z - t) / B.
    const float scale = io.loss_scale / kBatch;
    const int in = in_, out = out_;
    const bool last = last_;
    return stream.EnqueueHost([=]() -> absl::Status {
      for (int k = 0; k < kBatch * out; ++k) {
        a[k] = last ? scale * a[k] : dy[k] * (1.0f - a[k] * a[k]);  // dz, in place
      }
      if (dx == nullptr) return absl::OkStatus();
      for (int r = 0; r < kBatch; ++r) {
        for (int i = 0; i < in; ++i) {
          float g = 0;
          for (int o = 0; o < out; ++o) g += a[r * out + o] * w[o * in + i];
          dx[r * in + i] = g;
        }
      }
      return absl::OkStatus();
    });
  }

  // W: dW += dz^T x, db += sum_r dz (accumulates over the step's micro-batches).
  absl::Status BackwardWeight(const MicrobatchIO& io, Stream& stream) override {
    const float* x = static_cast<DenseStash*>(io.stash)->data();
    const float* dz = x + kBatch * in_;
    float* dw = params_.as<float>() + num_weights();
    float* db = dw + in_ * out_;
    const int in = in_, out = out_;
    return stream.EnqueueHost([=]() -> absl::Status {
      for (int r = 0; r < kBatch; ++r) {
        for (int o = 0; o < out; ++o) {
          for (int i = 0; i < in; ++i) dw[o * in + i] += dz[r * out + o] * x[r * in + i];
          db[o] += dz[r * out + o];
        }
      }
      return absl::OkStatus();
    });
  }

  absl::Status ZeroGrad(Stream& stream) override {
    float* grads = params_.as<float>() + num_weights();
    const std::size_t n = num_weights();
    return stream.EnqueueHost([=]() -> absl::Status {
      std::fill(grads, grads + n, 0.0f);
      return absl::OkStatus();
    });
  }

  absl::Status OptimizerStep(Stream& stream) override {
    float* p = params_.as<float>();
    const std::size_t n = num_weights();
    return stream.EnqueueHost([=]() -> absl::Status {
      for (std::size_t i = 0; i < n; ++i) p[i] -= kLr * p[n + i];
      return absl::OkStatus();
    });
  }

  // What a data-parallel run would average across replicas.
  std::vector<GradientSpan> gradients() override {
    return {GradientSpan{.data = params_.as<float>() + num_weights(), .count = num_weights()}};
  }

 private:
  DenseStage(int in, int out, bool last, Device& device)
      : in_(in), out_(out), last_(last), device_(device) {}
  std::size_t num_weights() const { return static_cast<std::size_t>(in_ * out_ + out_); }

  int in_, out_;
  bool last_;
  Device& device_;
  Buffer params_;
};

// The step's data, micro-batch-major as StepInputs wants it: M x B samples of
// x in [-1, 1)^4, t = sin(2 x0) + x1 x2 - 0.5 x3.
struct Data {
  std::vector<float> x, t;
};
// Process `share`'s samples: each process of a job trains on its own.
Data MakeData(int num_microbatches, int share) {
  Data d;
  const int n = num_microbatches * kBatch;
  for (int s = share * n; s < (share + 1) * n; ++s) {
    float f[kInputs];
    for (int i = 0; i < kInputs; ++i) f[i] = Uniform(7919u * s + i + 1);
    d.x.insert(d.x.end(), f, f + kInputs);
    d.t.push_back(std::sin(2 * f[0]) + f[1] * f[2] - 0.5f * f[3]);
  }
  return d;
}

absl::Status Run(const std::string& trace_path, pipesched::comm::Bootstrap* processes, bool split) {
  namespace ps = pipesched;
  constexpr int kStages = 2, kMicrobatches = 4, kSteps = 10;
  const int rank = processes == nullptr ? 0 : processes->rank();
  // The pipeline's two stages split across the processes, or each process a replica.
  // Four processes split: pipelines of two, replicas of each other (the groups must
  // outlive the executor, declared below).
  ps::stages::ExecutorOptions options;
  ps::comm::JobGrid grid;
  if (split && processes->size() > kStages) {
    absl::StatusOr<ps::comm::JobGrid> made = ps::comm::SplitJob(*processes, kStages);
    if (!made.ok()) return made.status();
    grid = std::move(made).value();
    options.pipeline = grid.pipeline.get();
    options.processes = grid.replicas.get();
  } else {
    (split ? options.pipeline : options.processes) = processes;
  }

  // 1F1B over P = 2 ranks, M = 4 micro-batches; the executor validates it again.
  absl::StatusOr<ps::scheduler::Schedule> schedule = ps::scheduler::GenerateSchedule(
      "1f1b", {.num_ranks = kStages, .num_microbatches = kMicrobatches});
  if (!schedule.ok()) return schedule.status();

  // Two emulated devices, one per rank; strict: waiting on an unrecorded event is an error.
  absl::StatusOr<std::unique_ptr<ps::runtime::Backend>> backend = ps::runtime::CreateBackend(
      {.kind = ps::runtime::BackendKind::kHost, .num_devices = kStages, .strict = true});
  if (!backend.ok()) return backend.status();

  // The executor asks for the StageWork of each (stage, replica) on its device.
  auto factory = [](int stage, int /*replica*/,
                    Device& device) -> absl::StatusOr<std::unique_ptr<ps::stages::StageWork>> {
    absl::StatusOr<std::unique_ptr<DenseStage>> work =
        stage == 0 ? DenseStage::Create(kInputs, kHidden, /*last=*/false, 1, device)
                   : DenseStage::Create(kHidden, 1, /*last=*/true, 2, device);
    if (!work.ok()) return work.status();
    return std::unique_ptr<ps::stages::StageWork>(std::move(work).value());
  };
  // Declared after the backend: destroyed first, as the runtime requires.
  absl::StatusOr<std::unique_ptr<ps::stages::Executor>> executor =
      ps::stages::Executor::Create(*schedule, **backend, factory, options);
  if (!executor.ok()) return executor.status();

  // Split, every process of a pipeline steps on that pipeline's batch (the first stage's
  // reads the inputs, the last stage's the targets); the replicas' shares differ.
  const int share = options.processes != nullptr ? options.processes->rank() : 0;
  const Data data = MakeData(kMicrobatches, share);
  const ps::stages::StepInputs inputs{
      .inputs = std::as_bytes(std::span<const float>(data.x)),
      .targets = std::as_bytes(std::span<const float>(data.t)),
  };
  ps::trace::Timeline last_timeline;
  for (int step = 0; step < kSteps; ++step) {
    absl::StatusOr<ps::stages::StepResult> result = (*executor)->Step(inputs);
    if (!result.ok()) return result.status();
    std::printf("step %d loss %.6f\n", step, result->loss);
    last_timeline = std::move(result->timeline);
  }

  // Tiny stages: the bubble here is mostly the executor's own per-action overhead.
  const ps::trace::BubbleStats stats = ps::trace::ComputeBubbleStats(last_timeline, kStages);
  std::printf("last step: %zu spans, measured bubble fraction %.3f\n", last_timeline.spans.size(),
              stats.bubble_fraction);
  if (rank != 0) return absl::OkStatus();  // process 0 writes the trace
  last_timeline.name = split ? "embed example: 1f1b P=2 M=4, a stage per process (measured)"
                             : "embed example: 1f1b P=2 M=4 (measured)";
  if (absl::Status s = ps::WriteFileAtomic(trace_path, ps::trace::ToChromeTrace({&last_timeline}));
      !s.ok()) {
    return s;
  }
  std::printf("wrote %s\n", trace_path.c_str());
  return absl::OkStatus();
}

}  // namespace

int main(int argc, char** argv) {
  std::printf("pipesched %s embed example\n", pipesched::VersionString());
  // Null unless `pipesched launch` started this process as one of a job.
  absl::StatusOr<std::unique_ptr<pipesched::comm::Bootstrap>> processes =
      pipesched::comm::CreateBootstrapFromEnvironment();
  absl::Status status = processes.status();
  if (processes.ok()) {
    if (*processes != nullptr) {
      std::printf("process %d of %d\n", (*processes)->rank(), (*processes)->size());
    }
    const bool split = argc > 1 && std::strcmp(argv[1], "--split") == 0;
    const int path_arg = split ? 2 : 1;
    if (split && *processes == nullptr) {
      status = absl::InvalidArgumentError(
          "--split splits the stages across the processes of a job: start it with `pipesched "
          "launch --processes=2 -- embed_example --split`");
    } else {
      status = Run(argc > path_arg ? argv[path_arg] : "embed_trace.json", processes->get(), split);
    }
    if (*processes != nullptr) {
      if (status.ok()) {
        status = (*processes)->Close();  // process 0 removes the rendezvous directory
      } else {
        (*processes)->Fail(std::string(status.message()));  // the others stop now, with this reason
      }
    }
  }
  if (!status.ok()) {
    std::fprintf(stderr, "embed_example: %s\n", status.ToString().c_str());
    return 1;
  }
  return 0;
}
