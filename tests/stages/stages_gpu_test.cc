// The executor on the CUDA backend against plain single-device training on the host:
// after 3 steps the parameters agree (cuBLAS fp32 with TF32 off vs OpenBLAS: 1e-4
// relative). Covers peer copies between stages, replicas sharing one GPU (the
// local-kernel all-reduce), activation recomputation and, with two or more GPUs, NCCL.
// Skips without a GPU.
#include <cmath>
#include <map>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "pipesched/model/reference.h"
#include "pipesched/stages/trainer.h"
#include "testing/gpu.h"
#include "testing/status_matchers.h"

namespace pipesched::stages {
namespace {

void RunAgainstReference(const std::string& schedule, int p, int v, int d, int m, int num_devices,
                         bool recompute = false) {
  SCOPED_TRACE(schedule + " P=" + std::to_string(p) + " D=" + std::to_string(d) +
               " devices=" + std::to_string(num_devices));
  TrainerConfig config;
  config.schedule = schedule;
  config.stages = p;
  config.virtual_stages = v;
  config.replicas = d;
  config.microbatches = m;
  config.microbatch_size = 4;
  config.model = {.d_in = 16, .d_hidden = 32, .num_classes = 8, .num_layers = 7};
  config.optimizer.sgd = {.lr = 0.05f, .momentum = 0.9f};
  config.backend = "cuda";
  config.num_devices = num_devices;
  config.strict = true;
  config.seed = 5;
  config.recompute = recompute;
  PS_ASSERT_OK_AND_ASSIGN(auto trainer, Trainer::Create(config));
  PS_ASSERT_OK_AND_ASSIGN(auto reference,
                          model::ReferenceTrainer::Create({.config = config.model,
                                                           .seed = config.seed,
                                                           .optimizer = config.optimizer,
                                                           .num_microbatches = d * m}));
  const std::int64_t g = trainer->global_batch();
  for (int step = 0; step < 3; ++step) {
    const float* x = trainer->data().x.data() + step * g * config.model.d_in;
    const std::int32_t* y = trainer->data().y.data() + step * g;
    PS_ASSERT_OK_AND_ASSIGN(StepResult r, trainer->Step(x, y));
    PS_ASSERT_OK(reference->Step(x, y, static_cast<int>(g)));
    EXPECT_EQ(r.timeline.num_ranks, p * d);
  }
  PS_ASSERT_OK_AND_ASSIGN(auto got, trainer->ExportParameters());
  PS_ASSERT_OK_AND_ASSIGN(auto want, reference->ExportParameters());
  std::map<std::string, std::vector<float>> ref;
  for (const auto& t : want) ref[t.name] = t.ToFloats().value();
  for (const auto& t : got) {
    std::vector<float> a = t.ToFloats().value();
    const std::vector<float>& r = ref[t.name];
    ASSERT_EQ(a.size(), r.size()) << t.name;
    for (std::size_t i = 0; i < a.size(); ++i) {
      ASSERT_LE(std::abs(a[i] - r[i]), 1e-6 + 1e-4 * std::abs(r[i]))
          << t.name << "[" << i << "]: cuda " << a[i] << " vs host reference " << r[i];
    }
  }
}

TEST(StagesGpuTest, OneGpuSharedByAllStagesAndReplicas) {
  PS_SKIP_IF_NO_GPU();
  RunAgainstReference("1f1b", 2, 1, 2, 4, 1);
  RunAgainstReference("zb-v", 2, 2, 2, 4, 1);
  // Activation recomputation: the rebuilt stashes give the same numbers on cuBLAS too.
  RunAgainstReference("zb-h1", 2, 1, 1, 4, 1, /*recompute=*/true);
}

TEST(StagesGpuTest, StagesOnSeparateGpusWithNccl) {
  PS_SKIP_IF_FEWER_GPUS(2);
  RunAgainstReference("1f1b", 2, 1, 1, 4, 2);
  RunAgainstReference("interleaved-1f1b", 1, 2, 2, 4, 2);
}

}  // namespace
}  // namespace pipesched::stages
