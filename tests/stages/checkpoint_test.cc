// Checkpoints (stages/checkpoint.h): on the host backend, training N steps equals
// training K, saving, loading into a fresh Trainer and training N - K more, bit for bit
// (SGD with momentum and AdamW, P = 2, D = 2); truncated, corrupted and mismatched files
// are rejected naming the problem; a save killed half-way leaves the previous checkpoint
// loadable.
#include "pipesched/stages/checkpoint.h"

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <functional>
#include <iostream>
#include <limits>
#include <map>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "pipesched/base/file_util.h"
#include "pipesched/base/status.h"
#include "pipesched/model/safetensors.h"
#include "pipesched/stages/trainer.h"
#include "testing/status_matchers.h"

namespace pipesched::stages {
namespace {

using ::pipesched::testing::StatusIs;
using ::testing::HasSubstr;

std::string TempPath(const std::string& name) {
  const char* dir = std::getenv("TMPDIR");
  return std::string(dir ? dir : "/tmp") + "/pipesched_ckpt_" + std::to_string(::getpid()) + "_" +
         name;
}

// The size of a file's data section: every tensor's bytes.
std::size_t CheckpointDataBytes(const model::SafetensorsFile& file) {
  std::size_t n = 0;
  for (const model::HostTensor& t : file.tensors) n += t.bytes.size();
  return n;
}

TrainerConfig Config(model::OptimizerKind kind) {
  TrainerConfig c;
  c.schedule = "1f1b";
  c.stages = 2;
  c.replicas = 2;
  c.microbatches = 4;
  c.microbatch_size = 4;
  c.model.num_layers = 3;
  c.model.d_hidden = 16;
  c.model.d_in = 8;
  c.model.num_classes = 5;
  c.optimizer.kind = kind;
  c.optimizer.sgd.lr = 0.05f;
  c.optimizer.sgd.momentum = 0.9f;
  c.optimizer.adamw.lr = 0.01f;
  c.backend = "host";
  c.seed = 7;
  c.synthetic_samples = 3 * 2 * 4 * 4 + 16;  // the cursor wraps around during the run
  return c;
}

// Every parameter and optimizer tensor, by name.
std::map<std::string, std::string> State(const Trainer& trainer) {
  const std::string path = TempPath("state.safetensors");
  EXPECT_TRUE(SaveCheckpoint(trainer, path).ok());
  auto file = model::ReadSafetensors(path);
  EXPECT_TRUE(file.ok()) << file.status();
  std::map<std::string, std::string> out;
  for (const model::HostTensor& t : file->tensors) out[t.name] = t.bytes;
  out["@step"] = file->metadata["step"];
  out["@data_cursor"] = file->metadata["data_cursor"];
  std::remove(path.c_str());
  return out;
}

TEST(CheckpointTest, ResumingEqualsTrainingStraightThroughBitForBit) {
  for (model::OptimizerKind kind : {model::OptimizerKind::kSgd, model::OptimizerKind::kAdamW}) {
    SCOPED_TRACE(model::OptimizerName(kind));
    constexpr int kN = 7, kK = 3;
    const std::string path = TempPath("resume.safetensors");
    PS_ASSERT_OK_AND_ASSIGN(auto straight, Trainer::Create(Config(kind)));
    std::vector<double> losses;
    for (int i = 0; i < kN; ++i) {
      PS_ASSERT_OK_AND_ASSIGN(StepResult r, straight->Step());
      losses.push_back(r.loss);
    }
    {
      PS_ASSERT_OK_AND_ASSIGN(auto first, Trainer::Create(Config(kind)));
      for (int i = 0; i < kK; ++i) PS_ASSERT_OK(first->Step().status());
      PS_ASSERT_OK(SaveCheckpoint(*first, path));
    }
    PS_ASSERT_OK_AND_ASSIGN(auto resumed, Trainer::Create(Config(kind)));
    PS_ASSERT_OK_AND_ASSIGN(CheckpointInfo info, LoadCheckpoint(path, *resumed));
    EXPECT_EQ(info.step, kK);
    EXPECT_EQ(info.data_cursor, kK * resumed->global_batch() % resumed->data().num_samples());
    for (int i = kK; i < kN; ++i) {
      PS_ASSERT_OK_AND_ASSIGN(StepResult r, resumed->Step());
      EXPECT_EQ(r.loss, losses[i]) << "step " << i + 1;
    }
    const auto a = State(*straight), b = State(*resumed);
    ASSERT_EQ(a.size(), b.size());
    EXPECT_GT(a.size(), 2 * 8u);  // parameters and optimizer state
    for (const auto& [name, bytes] : a) {
      EXPECT_TRUE(b.count(name) && b.at(name) == bytes) << name << " differs";
    }
    std::remove(path.c_str());
  }
}

TEST(CheckpointTest, SkewInjectedStagesSaveAndLoadLikePlainOnes) {
  // --slow-stage wraps a rank's stage work; checkpoints reach the model through it.
  TrainerConfig slow = Config(model::OptimizerKind::kSgd);
  slow.slow_rank = 1;
  slow.slow_factor = 1.5;
  const std::string path = TempPath("slow.safetensors");
  PS_ASSERT_OK_AND_ASSIGN(auto first, Trainer::Create(slow));
  PS_ASSERT_OK(first->Step().status());
  PS_ASSERT_OK(SaveCheckpoint(*first, path));
  PS_ASSERT_OK_AND_ASSIGN(auto plain, Trainer::Create(Config(model::OptimizerKind::kSgd)));
  PS_ASSERT_OK_AND_ASSIGN(CheckpointInfo info, LoadCheckpoint(path, *plain));
  EXPECT_EQ(info.step, 1);
  const auto a = State(*first), b = State(*plain);
  for (const auto& [name, bytes] : a) {
    EXPECT_TRUE(b.count(name) && b.at(name) == bytes) << name << " differs";
  }
  std::remove(path.c_str());
}

class CheckpointRejectTest : public ::testing::Test {
 protected:
  void SetUp() override {
    PS_ASSERT_OK_AND_ASSIGN(trainer_, Trainer::Create(Config(model::OptimizerKind::kSgd)));
    PS_ASSERT_OK(trainer_->Step().status());
    PS_ASSERT_OK(SaveCheckpoint(*trainer_, path_));
    PS_ASSERT_OK_AND_ASSIGN(bytes_, ReadFile(path_));
  }
  void TearDown() override { std::remove(path_.c_str()); }
  absl::Status LoadBytes(const std::string& bytes, TrainerConfig config) {
    PS_RETURN_IF_ERROR(WriteFileAtomic(path_, bytes));
    PS_ASSIGN_OR_RETURN(auto trainer, Trainer::Create(config));
    return LoadCheckpoint(path_, *trainer).status();
  }
  const std::string path_ = TempPath("reject.safetensors");
  std::unique_ptr<Trainer> trainer_;
  std::string bytes_;
};

TEST_F(CheckpointRejectTest, TruncatedFile) {
  const TrainerConfig c = Config(model::OptimizerKind::kSgd);
  for (std::size_t keep : {std::size_t{0}, std::size_t{5}, bytes_.size() / 2, bytes_.size() - 1}) {
    SCOPED_TRACE(keep);
    EXPECT_THAT(LoadBytes(bytes_.substr(0, keep), c),
                StatusIs(absl::StatusCode::kInvalidArgument,
                         HasSubstr("truncated or not a safetensors file")));
  }
}

TEST_F(CheckpointRejectTest, WhatIsNotSafetensorsIsRejectedByItsHeader) {
  PS_ASSERT_OK_AND_ASSIGN(auto trainer, Trainer::Create(Config(model::OptimizerKind::kSgd)));
  EXPECT_THAT(LoadCheckpoint("/dev/zero", *trainer),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("checkpoint /dev/zero rejected: truncated or not a safetensors "
                                 "file (safetensors '/dev/zero': is a character device")));
  EXPECT_THAT(LoadBytes(std::string(4096, '\0'), Config(model::OptimizerKind::kSgd)),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("truncated or not a safetensors file (safetensors '" + path_ +
                                 "': header length is 0: not a safetensors file")));
  EXPECT_THAT(LoadCheckpoint(TempPath("missing.safetensors"), *trainer),
              StatusIs(absl::StatusCode::kNotFound, HasSubstr("missing.safetensors")));
}

TEST_F(CheckpointRejectTest, CorruptedTensorBytesFailTheChecksum) {
  std::string bad = bytes_;
  bad[bad.size() - 3] ^= 0x10;  // a bit of the last tensor
  EXPECT_THAT(LoadBytes(bad, Config(model::OptimizerKind::kSgd)),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("checksum mismatch: the file is corrupted")));
}

TEST_F(CheckpointRejectTest, AnotherConfigurationIsNamed) {
  TrainerConfig c = Config(model::OptimizerKind::kSgd);
  c.model.d_hidden = 32;
  EXPECT_THAT(LoadBytes(bytes_, c),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("written for another configuration (--hidden: checkpoint 16, "
                                 "this run 32)")));
  EXPECT_THAT(LoadBytes(bytes_, Config(model::OptimizerKind::kAdamW)),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       // The state's kind follows from the optimizer: not a second item.
                       HasSubstr("written for another configuration (--optimizer: checkpoint "
                                 "sgd, this run adamw)")));
  // A schedule-only change is fine: the model and optimizer are schedule-independent.
  c = Config(model::OptimizerKind::kSgd);
  c.schedule = "gpipe";
  PS_EXPECT_OK(LoadBytes(bytes_, c));
}

TEST_F(CheckpointRejectTest, AnotherSeedOrDataSetIsNamed) {
  // The seed makes the synthetic data and every data set's sample order: another seed
  // would continue on other data.
  TrainerConfig c = Config(model::OptimizerKind::kSgd);
  c.seed = 8;
  EXPECT_THAT(LoadBytes(bytes_, c), StatusIs(absl::StatusCode::kInvalidArgument,
                                             HasSubstr("(--seed: checkpoint 7, this run 8)")));
  c = Config(model::OptimizerKind::kSgd);
  c.synthetic_samples = 0;  // 8 global batches
  EXPECT_THAT(LoadBytes(bytes_, c),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("the data set's sample count (--data; synthetic data: 8 x "
                                 "--replicas x --microbatches x --microbatch-size): checkpoint "
                                 "112, this run 256")));
}

TEST_F(CheckpointRejectTest, StepAndCursorOutOfRangeAreNamed) {
  // Metadata edited by a tool that wrote the checksum again: the checksum passes, the
  // values are checked on their own.
  auto with = [&](const std::string& key, const std::string& value) {
    absl::StatusOr<model::SafetensorsFile> file = model::ParseSafetensors(bytes_, path_);
    EXPECT_TRUE(file.ok()) << file.status();
    file->metadata[key] = value;
    file->metadata["checksum"] = CheckpointChecksum(*file);
    absl::StatusOr<std::string> bytes = model::SerializeSafetensors(*file);
    EXPECT_TRUE(bytes.ok()) << bytes.status();
    return *bytes;
  };
  const TrainerConfig c = Config(model::OptimizerKind::kSgd);
  PS_EXPECT_OK(LoadBytes(with("step", "5"), c));
  EXPECT_THAT(LoadBytes(with("step", "9223372036854775807"), c),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("bad step '9223372036854775807': a count of optimizer steps "
                                 "from 0 to 2^53 is expected")));
  EXPECT_THAT(LoadBytes(with("step", "-1"), c),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("bad step '-1'")));
  EXPECT_THAT(LoadBytes(with("data_cursor", "112"), c),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("bad data_cursor '112': the next sample of a data set of 112 "
                                 "is expected (0 to 111)")));
}

// --init (Trainer::LoadParameters) of a checkpoint checks its checksum as --resume does.
TEST_F(CheckpointRejectTest, InitOfACorruptedCheckpointFailsTheChecksum) {
  PS_ASSERT_OK_AND_ASSIGN(auto fresh, Trainer::Create(Config(model::OptimizerKind::kSgd)));
  std::string bad = bytes_;
  bad[bad.size() - 3] ^= 0x10;  // a bit of the last tensor
  PS_ASSERT_OK(WriteFileAtomic(path_, bad));
  EXPECT_THAT(fresh->LoadParameters(path_),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("checkpoint " + path_ +
                                 " rejected: checksum mismatch: the file is corrupted (stored "
                                 "'fnv1a64:")));
  // A parameter's byte, not only the optimizer state's (which --init does not load).
  PS_ASSERT_OK_AND_ASSIGN(model::SafetensorsFile file, model::ParseSafetensors(bytes_, path_));
  ASSERT_EQ(file.tensors.front().name.rfind("blocks.", 0), 0u) << file.tensors.front().name;
  bad = bytes_;
  bad[bytes_.size() - CheckpointDataBytes(file)] ^= 0x01;
  PS_ASSERT_OK(WriteFileAtomic(path_, bad));
  EXPECT_THAT(fresh->LoadParameters(path_),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("checksum mismatch: the file is corrupted")));
  // A checkpoint whose checksum entry was removed is not trusted either.
  file.metadata.erase("checksum");
  PS_ASSERT_OK_AND_ASSIGN(std::string unsummed, model::SerializeSafetensors(file));
  PS_ASSERT_OK(WriteFileAtomic(path_, unsummed));
  EXPECT_THAT(fresh->LoadParameters(path_),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("checksum mismatch: the file is corrupted (stored '', computed "
                                 "'fnv1a64:")));
  // The intact checkpoint loads, and gives the saved parameters.
  PS_ASSERT_OK(WriteFileAtomic(path_, bytes_));
  PS_ASSERT_OK(fresh->LoadParameters(path_));
  PS_ASSERT_OK_AND_ASSIGN(auto loaded, fresh->ExportParameters());
  PS_ASSERT_OK_AND_ASSIGN(auto saved, trainer_->ExportParameters());
  ASSERT_EQ(loaded.size(), saved.size());
  for (std::size_t i = 0; i < saved.size(); ++i) {
    EXPECT_EQ(loaded[i].bytes, saved[i].bytes) << saved[i].name;
  }
}

// Files written elsewhere carry no pipesched checksum entry and load under --init, as
// does one whose "checksum" entry is another tool's.
TEST_F(CheckpointRejectTest, InitOfAFileWithoutTheChecksumEntryLoads) {
  PS_ASSERT_OK_AND_ASSIGN(auto fresh, Trainer::Create(Config(model::OptimizerKind::kSgd)));
  model::SafetensorsFile file;
  PS_ASSERT_OK_AND_ASSIGN(file.tensors, trainer_->ExportParameters());
  file.metadata["format"] = "pt";
  PS_ASSERT_OK(model::WriteSafetensors(path_, file));
  PS_EXPECT_OK(fresh->LoadParameters(path_));
  file.metadata["checksum"] = "sha256:0123";
  PS_ASSERT_OK(model::WriteSafetensors(path_, file));
  PS_EXPECT_OK(fresh->LoadParameters(path_));
  PS_ASSERT_OK(trainer_->SaveParameters(path_));  // pipesched's parameters-only file
  PS_EXPECT_OK(fresh->LoadParameters(path_));
}

TEST_F(CheckpointRejectTest, ParametersOnlyFileIsNotACheckpoint) {
  PS_ASSERT_OK(trainer_->SaveParameters(path_));
  PS_ASSERT_OK_AND_ASSIGN(std::string params_only, ReadFile(path_));
  EXPECT_THAT(
      LoadBytes(params_only, Config(model::OptimizerKind::kSgd)),
      StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("not a pipesched checkpoint")));
}

// A child process trains and saves in a loop; SIGKILL lands at some point of a save (the
// saves take most of its time). The file at `path` must always load: either the parent's
// first checkpoint or one of the child's complete ones.
// The Trainer's API refuses what cannot be right instead of reading out of bounds or
// computing with wrapped sizes (a review of the library on 2026-12-03 found each).
TEST(TrainerApiTest, ValuesThatCannotBeRightAreErrors) {
  PS_ASSERT_OK_AND_ASSIGN(auto trainer, Trainer::Create(Config(model::OptimizerKind::kSgd)));
  const std::int64_t n = trainer->data().num_samples();
  EXPECT_THAT(trainer->set_data_cursor(-5),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr(absl::StrCat("data cursor -5 is outside the data set's samples "
                                              "[0, ",
                                              n, ")"))));
  EXPECT_EQ(trainer->set_data_cursor(n).code(), absl::StatusCode::kInvalidArgument);
  PS_EXPECT_OK(trainer->set_data_cursor(n - 1));
  PS_EXPECT_OK(trainer->Step().status());
  EXPECT_THAT(trainer->Step(nullptr, nullptr),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("got a null pointer")));

  struct Case {
    std::function<void(TrainerConfig&)> change;
    std::string message;
  };
  const Case cases[] = {
      {[](TrainerConfig& c) { c.num_devices = -4; },
       "the number of devices must be 0 (one per rank and replica) or more, not -4"},
      {[](TrainerConfig& c) { c.synthetic_samples = -5; },
       "the synthetic data set's size must be 0 (8 global batches) to 1099511627776 samples, "
       "not -5"},
      {[](TrainerConfig& c) { c.synthetic_samples = std::numeric_limits<std::int64_t>::max(); },
       "the synthetic data set's size must be 0"},
      {[](TrainerConfig& c) { c.replicas = std::numeric_limits<int>::max(); },
       "the number of replicas must be in [1, 4096]"},
      {[](TrainerConfig& c) { c.microbatch_size = 1 << 21; },
       "the micro-batch size must be at most 1048576"},
      {[](TrainerConfig& c) { c.model.num_layers = std::numeric_limits<int>::max(); },
       "model num_layers must be in [1, 4096]"},
      {[](TrainerConfig& c) { c.model.d_in = c.model.d_hidden = std::numeric_limits<int>::max(); },
       "model d_in must be in [1, 65536]"},
  };
  for (const Case& c : cases) {
    TrainerConfig config = Config(model::OptimizerKind::kSgd);
    c.change(config);
    EXPECT_THAT(Trainer::Create(config).status(),
                StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr(c.message)));
  }
}

// Parameters that are not finite (a last update that diverged) are named, and a trainer's
// own finite ones pass.
TEST(TrainerApiTest, NonFiniteParametersAreNamed) {
  model::HostTensor t{.name = "blocks.1.bias", .dtype = model::DType::kF32, .shape = {3}};
  const float values[3] = {0.5f, -std::numeric_limits<float>::infinity(), 1.0f};
  t.bytes.assign(reinterpret_cast<const char*>(values), sizeof(values));
  model::HostTensor labels{.name = "y", .dtype = model::DType::kI32, .shape = {1}};
  labels.bytes = std::string(4, '\xff');
  EXPECT_THAT(Trainer::CheckFinite({labels, t}),
              StatusIs(absl::StatusCode::kFailedPrecondition,
                       HasSubstr("'blocks.1.bias' holds -inf at element 1: training diverged")));
  PS_EXPECT_OK(Trainer::CheckFinite({labels}));
  PS_ASSERT_OK_AND_ASSIGN(auto trainer, Trainer::Create(Config(model::OptimizerKind::kSgd)));
  PS_ASSERT_OK(trainer->Step().status());
  PS_EXPECT_OK(trainer->CheckParametersFinite());
}

TEST(TrainerApiTest, AFailedImportLeavesEveryParameterAsItWas) {
  PS_ASSERT_OK_AND_ASSIGN(auto trainer, Trainer::Create(Config(model::OptimizerKind::kSgd)));
  PS_ASSERT_OK_AND_ASSIGN(std::vector<model::HostTensor> before, trainer->ExportParameters());
  std::vector<model::HostTensor> changed = before;
  for (model::HostTensor& t : changed) {
    if (t.name == "blocks.0.weight") t.bytes[0] ^= 0x7f;  // a valid new value...
    if (t.name == "head.bias") {                          // ... and an invalid one later
      const float nan = std::numeric_limits<float>::quiet_NaN();
      std::memcpy(t.bytes.data(), &nan, sizeof(nan));
    }
  }
  EXPECT_THAT(
      trainer->ImportParameters(changed),
      StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("parameter 'head.bias' holds nan")));
  PS_ASSERT_OK_AND_ASSIGN(std::vector<model::HostTensor> after, trainer->ExportParameters());
  ASSERT_EQ(after.size(), before.size());
  for (std::size_t i = 0; i < before.size(); ++i) {
    EXPECT_EQ(after[i].bytes, before[i].bytes) << after[i].name;  // blocks.0.weight included
  }
}

TEST(CheckpointKillTest, KillDuringSaveLeavesALoadableCheckpoint) {
  TrainerConfig c = Config(model::OptimizerKind::kAdamW);
  c.model.d_hidden = 384;  // ~3.5 MB per save: the kill usually lands mid-write
  c.replicas = 1;
  const std::string path = TempPath("killed.safetensors");
  {
    PS_ASSERT_OK_AND_ASSIGN(auto trainer, Trainer::Create(c));
    PS_ASSERT_OK(trainer->Step().status());
    PS_ASSERT_OK(SaveCheckpoint(*trainer, path));
  }                   // no thread of ours is left when we fork
  int mid_write = 0;  // rounds in which the kill left a temporary file behind
  for (int round = 0; round < 6; ++round) {
    SCOPED_TRACE(round);
    const pid_t child = ::fork();
    ASSERT_GE(child, 0);
    if (child == 0) {
      auto trainer = Trainer::Create(c);
      if (!trainer.ok()) ::_exit(3);
      for (;;) {
        if (!(*trainer)->Step().ok()) ::_exit(4);
        for (int i = 0; i < 3; ++i) {
          if (!SaveCheckpoint(**trainer, path).ok()) ::_exit(5);
        }
      }
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(150 + 60 * round));
    ASSERT_EQ(::kill(child, SIGKILL), 0);
    int status = 0;
    ASSERT_EQ(::waitpid(child, &status, 0), child);
    ASSERT_TRUE(WIFSIGNALED(status)) << "the child exited with " << WEXITSTATUS(status);
    PS_ASSERT_OK_AND_ASSIGN(auto trainer, Trainer::Create(c));
    PS_ASSERT_OK_AND_ASSIGN(CheckpointInfo info, LoadCheckpoint(path, *trainer));
    EXPECT_GE(info.step, 1);
    PS_EXPECT_OK(trainer->Step().status());
    const std::string tmp = path + ".tmp." + std::to_string(child);  // the killed save's
    mid_write += ::access(tmp.c_str(), F_OK) == 0;
    std::remove(tmp.c_str());
  }
  std::cout << "killed during a write in " << mid_write << " of 6 rounds\n";
  std::remove(path.c_str());
}

}  // namespace
}  // namespace pipesched::stages
