// A toy StageWork for executor tests and benchmarks, host backend only: each stage is
// the elementwise affine map y = a * x + b on K features (two scalar parameters), the
// last stage adds the loss mean(0.5 * (y - t)^2) over the micro-batch's B x K values.
// Small enough to check against a plain double-precision reference; `empty` makes every
// callback enqueue nothing (executor overhead benchmarks). SleepyWork: a stage whose
// every action only occupies its stream for a fixed time (timing tests). ToyFactory,
// ToyData and AsInputs: the executor's factory and a step's data for them.
#pragma once

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <span>
#include <stdexcept>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "pipesched/runtime/runtime.h"
#include "pipesched/stages/executor.h"
#include "pipesched/stages/stage_work.h"

namespace pipesched::stages::testing {

struct ToyOptions {
  int features = 4;  // K
  int batch = 2;     // B
  float lr = 0.1f;
  bool empty = false;                   // callbacks enqueue no work at all
  int fail_forward_of_microbatch = -1;  // F of this micro-batch fails (on its stream)
  bool throw_instead = false;           // ... by throwing rather than returning an error
  std::int64_t stash_bytes = -1;        // what stash_bytes() reports; -1: what it allocates
};

// Initial parameters of stage s: a = 1 + 0.1 * (s + 1), b = 0.05 * s.
inline float ToyA(int stage) { return 1.0f + 0.1f * static_cast<float>(stage + 1) * 0.5f; }
inline float ToyB(int stage) { return 0.05f * static_cast<float>(stage) - 0.02f; }

class ToyStash final : public ActivationStash {
 public:
  runtime::Buffer buffer;  // [x (B*K)][dy (B*K)]
  std::int64_t bytes() const override { return static_cast<std::int64_t>(buffer.size()); }
  absl::Status FreeAsync(runtime::Stream& stream) override { return buffer.FreeAsync(stream); }
};

class ToyStage final : public StageWork {
 public:
  ToyStage(int stage, int num_stages, ToyOptions options, runtime::Device& device)
      : stage_(stage), last_(stage == num_stages - 1), o_(options), device_(device) {
    auto stream = device.CreateStream("toy setup").value();
    params_ = device.Allocate(4 * sizeof(float), *stream).value();  // a, b, ga, gb
    float init[4] = {ToyA(stage), ToyB(stage), 0, 0};
    // The allocation is stream-ordered: reach it before the (unordered) host copy.
    absl::Status setup = stream->Synchronize();
    if (setup.ok()) setup = device.CopyFromHost(params_.data(), init, sizeof(init));
    if (!setup.ok()) {
      std::fprintf(stderr, "ToyStage setup failed: %s\n", setup.ToString().c_str());
      std::abort();
    }
  }

  float a() const { return params_.as<float>()[0]; }
  float b() const { return params_.as<float>()[1]; }

  std::size_t n() const { return static_cast<std::size_t>(o_.features) * o_.batch; }
  std::size_t input_bytes() const override { return n() * sizeof(float); }
  std::size_t output_bytes() const override { return last_ ? 0 : n() * sizeof(float); }
  std::size_t target_bytes() const override { return last_ ? n() * sizeof(float) : 0; }
  std::int64_t stash_bytes() const override {
    return o_.stash_bytes != -1 ? o_.stash_bytes
                                : static_cast<std::int64_t>(2 * n() * sizeof(float));
  }
  std::int64_t num_params() const override { return 2; }

  absl::StatusOr<std::unique_ptr<ActivationStash>> AllocateStash(runtime::Stream& stream) override {
    auto stash = std::make_unique<ToyStash>();
    auto buffer = device_.Allocate(2 * n() * sizeof(float), stream);
    if (!buffer.ok()) return buffer.status();
    stash->buffer = std::move(buffer).value();
    return std::unique_ptr<ActivationStash>(std::move(stash));
  }

  absl::Status Forward(const MicrobatchIO& io, runtime::Stream& stream) override {
    if (o_.empty) return absl::OkStatus();
    float* p = params_.as<float>();
    float* st = static_cast<ToyStash*>(io.stash)->buffer.as<float>();
    const auto* x = static_cast<const float*>(io.input);
    auto* y = static_cast<float*>(io.output);
    const auto* t = static_cast<const float*>(io.targets);
    float* loss = io.loss;
    const std::size_t n = this->n();
    const bool fail = io.microbatch == o_.fail_forward_of_microbatch;
    const bool throw_instead = o_.throw_instead;
    const int stage = stage_;
    return stream.EnqueueHost([=]() -> absl::Status {
      if (fail && throw_instead) {
        throw std::runtime_error(absl::StrCat("toy F of stage ", stage, " threw"));
      }
      if (fail) return absl::InternalError(absl::StrCat("toy F of stage ", stage, " failed"));
      std::memcpy(st, x, n * sizeof(float));
      double sum = 0;
      for (std::size_t i = 0; i < n; ++i) {
        const float out = p[0] * x[i] + p[1];
        if (y != nullptr) y[i] = out;
        if (t != nullptr) {
          st[n + i] = out - t[i];  // residual, turned into dy by the backward
          sum += 0.5 * static_cast<double>(out - t[i]) * (out - t[i]);
        }
      }
      if (loss != nullptr) *loss = static_cast<float>(sum / static_cast<double>(n));
      return absl::OkStatus();
    });
  }

  absl::Status BackwardInput(const MicrobatchIO& io, runtime::Stream& stream) override {
    if (o_.empty) return absl::OkStatus();
    float* p = params_.as<float>();
    float* st = static_cast<ToyStash*>(io.stash)->buffer.as<float>();
    const auto* dy_in = static_cast<const float*>(io.grad_output);
    auto* dx = static_cast<float*>(io.grad_input);
    const std::size_t n = this->n();
    const float scale = io.loss_scale / static_cast<float>(n);
    const bool last = last_;
    return stream.EnqueueHost([=]() -> absl::Status {
      for (std::size_t i = 0; i < n; ++i) {
        const float dy = last ? scale * st[n + i] : dy_in[i];
        st[n + i] = dy;
        if (dx != nullptr) dx[i] = p[0] * dy;
      }
      return absl::OkStatus();
    });
  }

  absl::Status BackwardWeight(const MicrobatchIO& io, runtime::Stream& stream) override {
    if (o_.empty) return absl::OkStatus();
    float* p = params_.as<float>();
    const float* st = static_cast<ToyStash*>(io.stash)->buffer.as<float>();
    const std::size_t n = this->n();
    return stream.EnqueueHost([=]() -> absl::Status {
      float ga = 0, gb = 0;
      for (std::size_t i = 0; i < n; ++i) {
        ga += st[n + i] * st[i];
        gb += st[n + i];
      }
      p[2] += ga;
      p[3] += gb;
      return absl::OkStatus();
    });
  }

  absl::Status ZeroGrad(runtime::Stream& stream) override {
    if (o_.empty) return absl::OkStatus();
    float* p = params_.as<float>();
    return stream.EnqueueHost([p] {
      p[2] = p[3] = 0;
      return absl::OkStatus();
    });
  }

  absl::Status OptimizerStep(runtime::Stream& stream) override {
    if (o_.empty) return absl::OkStatus();
    float* p = params_.as<float>();
    const float lr = o_.lr;
    return stream.EnqueueHost([p, lr] {
      p[0] -= lr * p[2];
      p[1] -= lr * p[3];
      return absl::OkStatus();
    });
  }

  std::vector<GradientSpan> gradients() override {
    return {GradientSpan{.data = params_.as<float>() + 2, .count = 2}};
  }

 private:
  int stage_;
  bool last_;
  ToyOptions o_;
  runtime::Device& device_;
  runtime::Buffer params_;
};

// Plain double-precision training of the same toy pipeline: S stages in sequence, G
// micro-batches per step (gradients of each scaled by 1 / G), SGD.
struct ToyReference {
  int num_stages = 1;
  ToyOptions options;
  std::vector<double> a, b;

  ToyReference(int stages, ToyOptions o) : num_stages(stages), options(o) {
    for (int s = 0; s < stages; ++s) {
      a.push_back(ToyA(s));
      b.push_back(ToyB(s));
    }
  }
  // x, t: G micro-batches of B*K values each, back to back.
  void Step(const std::vector<float>& x, const std::vector<float>& t, int g) {
    const std::size_t n = static_cast<std::size_t>(options.features) * options.batch;
    std::vector<double> ga(num_stages, 0), gb(num_stages, 0);
    for (int j = 0; j < g; ++j) {
      std::vector<std::vector<double>> act(num_stages + 1, std::vector<double>(n));
      for (std::size_t i = 0; i < n; ++i) act[0][i] = x[j * n + i];
      for (int s = 0; s < num_stages; ++s) {
        for (std::size_t i = 0; i < n; ++i) act[s + 1][i] = a[s] * act[s][i] + b[s];
      }
      std::vector<double> dy(n);
      for (std::size_t i = 0; i < n; ++i) {
        dy[i] = (act[num_stages][i] - t[j * n + i]) / static_cast<double>(n) / g;
      }
      for (int s = num_stages - 1; s >= 0; --s) {
        for (std::size_t i = 0; i < n; ++i) {
          ga[s] += dy[i] * act[s][i];
          gb[s] += dy[i];
          dy[i] *= a[s];
        }
      }
    }
    for (int s = 0; s < num_stages; ++s) {
      a[s] -= options.lr * ga[s];
      b[s] -= options.lr * gb[s];
    }
  }
};

// A stage work whose every action occupies its stream for a fixed time (and its zero-grad
// and optimizer step for theirs, none by default).
class SleepyWork final : public StageWork {
 public:
  explicit SleepyWork(double micros, double zero_grad_micros = 0, double optimizer_micros = 0)
      : micros_(micros), zero_grad_micros_(zero_grad_micros), optimizer_micros_(optimizer_micros) {}
  std::size_t input_bytes() const override { return 4; }
  std::size_t output_bytes() const override { return 4; }
  std::size_t target_bytes() const override { return 4; }
  std::int64_t stash_bytes() const override { return 0; }
  std::int64_t num_params() const override { return 0; }
  absl::StatusOr<std::unique_ptr<ActivationStash>> AllocateStash(runtime::Stream&) override {
    return nullptr;
  }
  // The F of micro-batch `microbatch` takes `micros` instead (a stall, for watchdog tests).
  void SlowForwardOf(int microbatch, double micros) {
    slow_microbatch_ = microbatch;
    slow_micros_ = micros;
  }
  absl::Status Forward(const MicrobatchIO& io, runtime::Stream& s) override {
    return s.EnqueueBusyWait(io.microbatch == slow_microbatch_ ? slow_micros_ : micros_);
  }
  absl::Status BackwardInput(const MicrobatchIO&, runtime::Stream& s) override {
    return s.EnqueueBusyWait(micros_);
  }
  absl::Status BackwardWeight(const MicrobatchIO&, runtime::Stream& s) override {
    return s.EnqueueBusyWait(micros_);
  }
  absl::Status ZeroGrad(runtime::Stream& s) override {
    return zero_grad_micros_ > 0 ? s.EnqueueBusyWait(zero_grad_micros_) : absl::OkStatus();
  }
  absl::Status OptimizerStep(runtime::Stream& s) override {
    return optimizer_micros_ > 0 ? s.EnqueueBusyWait(optimizer_micros_) : absl::OkStatus();
  }
  std::vector<GradientSpan> gradients() override { return {}; }

 private:
  double micros_;
  double zero_grad_micros_;
  double optimizer_micros_;
  int slow_microbatch_ = -1;
  double slow_micros_ = 0;
};

// A factory of ToyStages (ExecutorOptions' StageWorkFactory) for a pipeline of
// `num_stages`.
inline StageWorkFactory ToyFactory(int num_stages, ToyOptions options) {
  return
      [num_stages, options](int stage, int,
                            runtime::Device& device) -> absl::StatusOr<std::unique_ptr<StageWork>> {
        return std::make_unique<ToyStage>(stage, num_stages, options, device);
      };
}

// Deterministic data for step k: G micro-batches of n values.
inline void ToyData(int step, int g, std::size_t n, std::vector<float>& x, std::vector<float>& t) {
  x.resize(g * n);
  t.resize(g * n);
  for (std::size_t i = 0; i < g * n; ++i) {
    x[i] = std::sin(0.37f * static_cast<float>(i) + static_cast<float>(step));
    t[i] = 0.5f * std::cos(0.11f * static_cast<float>(i)) - 0.2f;
  }
}

inline StepInputs AsInputs(const std::vector<float>& x, const std::vector<float>& t) {
  return {.inputs = std::as_bytes(std::span(x)), .targets = std::as_bytes(std::span(t))};
}

}  // namespace pipesched::stages::testing
