// Training checkpoints (stages/checkpoint.h).
#include "pipesched/stages/checkpoint.h"

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "pipesched/base/hash.h"
#include "pipesched/base/status.h"
#include "pipesched/base/strings.h"
#include "pipesched/model/chunk.h"
#include "pipesched/model/safetensors.h"
#include "pipesched/stages/mlp_stage_work.h"

namespace pipesched::stages {
namespace {

constexpr char kFormat[] = "pipesched-checkpoint";
constexpr char kOptimizerPrefix[] = "optimizer.";
constexpr char kChecksumPrefix[] = "fnv1a64:";

}  // namespace

std::string CheckpointChecksum(const model::SafetensorsFile& file) {
  Fnv1a64 h;
  for (const auto& [key, value] : file.metadata) {  // std::map: sorted
    if (key == "checksum") continue;
    h.AddField(key);
    h.AddField(value);
  }
  std::map<std::string, const model::HostTensor*> by_name;
  for (const model::HostTensor& t : file.tensors) by_name[t.name] = &t;
  for (const auto& [name, t] : by_name) {
    h.AddField(name);
    h.AddField(model::DTypeName(t->dtype));
    h.AddField(absl::StrJoin(t->shape, ","));
    h.Add(t->bytes);
  }
  return absl::StrFormat("%s%016x", kChecksumPrefix, h.value());
}

namespace {

absl::StatusOr<model::Chunk*> ChunkOf(const Trainer& trainer, int replica, int stage) {
  return &trainer.chunk(replica, stage);
}

std::string OptimizerState(const model::OptimizerConfig& o) {
  if (o.kind == model::OptimizerKind::kAdamW) return "adamw";
  return o.sgd.momentum != 0.0f ? "momentum" : "none";
}

// The entries a checkpoint must agree on with the run that loads it, flag-named.
std::map<std::string, std::string> Configuration(const Trainer& trainer) {
  const TrainerConfig& c = trainer.config();
  return {
      {"model.layers", absl::StrCat(c.model.num_layers)},
      {"model.hidden", absl::StrCat(c.model.d_hidden)},
      {"model.inputs", absl::StrCat(c.model.d_in)},
      {"model.classes", absl::StrCat(c.model.num_classes)},
      {"optimizer", std::string(model::OptimizerName(c.optimizer.kind))},
      {"optimizer.state", OptimizerState(c.optimizer)},
      {"data_samples", absl::StrCat(trainer.data().num_samples())},
      // The synthetic data and every data set's sample order come from it.
      {"seed", absl::StrCat(c.seed)},
  };
}

// What the user would type to change an entry of Configuration().
std::string FlagOf(const std::string& key) {
  static const std::map<std::string, std::string> kFlags = {
      {"model.layers", "--layers"},
      {"model.hidden", "--hidden"},
      {"model.inputs", "--inputs"},
      {"model.classes", "--classes"},
      {"optimizer", "--optimizer"},
      {"optimizer.state", "--momentum (0 = no state)"},
      {"data_samples",
       "the data set's sample count (--data; synthetic data: 8 x --replicas x --microbatches "
       "x --microbatch-size)"},
      {"seed", "--seed"},
  };
  auto it = kFlags.find(key);
  return it == kFlags.end() ? key : it->second;
}

absl::Status Rejected(const std::string& path, std::string_view why) {
  return absl::InvalidArgumentError(absl::StrCat("checkpoint ", path, " rejected: ", Absl(why)));
}

}  // namespace

absl::StatusOr<model::SafetensorsFile> MakeCheckpoint(const Trainer& trainer) {
  model::SafetensorsFile file;
  PS_ASSIGN_OR_RETURN(file.tensors, trainer.ExportParameters());
  std::int64_t step = 0;
  PS_ASSIGN_OR_RETURN(std::vector<model::HostTensor> state, trainer.ExportOptimizerStates(&step));
  for (model::HostTensor& t : state) {
    t.name = kOptimizerPrefix + t.name;
    file.tensors.push_back(std::move(t));
  }
  // LoadCheckpoint refuses such a file: say so now. Every process of a split pipeline
  // has the whole model here, so all of them refuse alike.
  if (absl::Status finite = Trainer::CheckFinite(file.tensors); !finite.ok()) {
    return absl::Status(finite.code(),
                        absl::StrCat("no checkpoint after step ", step, ": ", finite.message()));
  }
  const TrainerConfig& c = trainer.config();
  file.metadata = Configuration(trainer);
  file.metadata["format"] = kFormat;
  file.metadata["version"] = "1";
  file.metadata["producer"] = "pipesched";
  file.metadata["step"] = absl::StrCat(step);
  file.metadata["data_cursor"] = absl::StrCat(trainer.data_cursor());
  file.metadata["optimizer.lr"] = absl::StrCat(
      c.optimizer.kind == model::OptimizerKind::kAdamW ? c.optimizer.adamw.lr : c.optimizer.sgd.lr);
  file.metadata["optimizer.momentum"] = absl::StrCat(c.optimizer.sgd.momentum);
  file.metadata["optimizer.weight_decay"] =
      absl::StrCat(c.optimizer.kind == model::OptimizerKind::kAdamW ? c.optimizer.adamw.weight_decay
                                                                    : c.optimizer.sgd.weight_decay);
  file.metadata["checksum"] = CheckpointChecksum(file);
  return file;
}

absl::Status SaveCheckpoint(const Trainer& trainer, const std::string& path) {
  PS_ASSIGN_OR_RETURN(const model::SafetensorsFile file, MakeCheckpoint(trainer));
  absl::Status written = model::WriteSafetensors(path, file);
  if (!written.ok()) {
    return absl::Status(written.code(),
                        absl::StrCat("cannot save checkpoint ", path, ": ", written.message()));
  }
  return absl::OkStatus();
}

absl::Status VerifyCheckpointChecksum(const model::SafetensorsFile& file, const std::string& path) {
  auto it = file.metadata.find("checksum");
  const std::string stored = it == file.metadata.end() ? std::string() : it->second;
  auto format = file.metadata.find("format");
  const bool checkpoint = format != file.metadata.end() && format->second == kFormat;
  if (!checkpoint && stored.rfind(kChecksumPrefix, 0) != 0) return absl::OkStatus();
  const std::string computed = CheckpointChecksum(file);
  if (stored != computed) {
    return Rejected(path, absl::StrCat("checksum mismatch: the file is corrupted (stored '", stored,
                                       "', computed '", computed, "')"));
  }
  return absl::OkStatus();
}

absl::StatusOr<CheckpointInfo> LoadCheckpoint(const std::string& path, Trainer& trainer) {
  // The reader checks sizes before reading the data: a file that is not a checkpoint fails
  // after its header, however large it is.
  absl::StatusOr<model::SafetensorsFile> parsed = model::ReadSafetensors(path);
  if (parsed.status().code() == absl::StatusCode::kInvalidArgument) {
    return Rejected(path, absl::StrCat("truncated or not a safetensors file (",
                                       parsed.status().message(), ")"));
  }
  if (!parsed.ok()) return parsed.status();  // cannot open or read it, or too large
  const model::SafetensorsFile& file = *parsed;
  auto meta = [&](const std::string& key) -> std::string {
    auto it = file.metadata.find(key);
    return it == file.metadata.end() ? std::string() : it->second;
  };
  if (meta("format") != kFormat) {
    return Rejected(path, absl::StrCat("not a pipesched checkpoint (its metadata has no format=",
                                       kFormat, "); to load parameters only, use --init"));
  }
  if (meta("version") != "1") {
    return Rejected(path, absl::StrCat("version '", meta("version"), "' is not supported (1 is)"));
  }
  PS_RETURN_IF_ERROR(VerifyCheckpointChecksum(file, path));
  std::vector<std::string> mismatches;
  const std::map<std::string, std::string> configuration = Configuration(trainer);
  for (const auto& [key, value] : configuration) {
    // The optimizer's state follows from the optimizer: one mismatch says it.
    if (key == "optimizer.state" && meta("optimizer") != configuration.at("optimizer")) continue;
    if (meta(key) != value) {
      mismatches.push_back(
          absl::StrCat(FlagOf(key), ": checkpoint ", meta(key), ", this run ", value));
    }
  }
  if (!mismatches.empty()) {
    return Rejected(path, absl::StrCat("written for another configuration (",
                                       absl::StrJoin(mismatches, "; "), ")"));
  }
  CheckpointInfo info;
  // Far beyond any run, and leaves room to count on without overflow.
  constexpr std::int64_t kMaxStep = std::int64_t{1} << 53;
  if (!absl::SimpleAtoi(meta("step"), &info.step) || info.step < 0 || info.step > kMaxStep) {
    return Rejected(path, absl::StrCat("bad step '", meta("step"),
                                       "': a count of optimizer steps from 0 to 2^53 is expected"));
  }
  const std::int64_t samples = trainer.data().num_samples();
  if (!absl::SimpleAtoi(meta("data_cursor"), &info.data_cursor) || info.data_cursor < 0 ||
      info.data_cursor >= samples) {
    return Rejected(path, absl::StrCat("bad data_cursor '", meta("data_cursor"),
                                       "': the next sample of a data set of ", samples,
                                       " is expected (0 to ", samples - 1, ")"));
  }

  std::vector<model::HostTensor> params, state;
  for (const model::HostTensor& t : file.tensors) {
    if (t.name.rfind(kOptimizerPrefix, 0) == 0) {
      model::HostTensor s = t;
      s.name = t.name.substr(sizeof(kOptimizerPrefix) - 1);
      state.push_back(std::move(s));
    } else {
      params.push_back(t);
    }
  }
  absl::Status imported = trainer.ImportParameters(params);
  for (int d = 0; d < trainer.config().replicas && imported.ok(); ++d) {
    for (int s = 0; s < trainer.executor().num_stages() && imported.ok(); ++s) {
      if (!trainer.runs_stage(s)) continue;  // another process's (it loads its own)
      absl::StatusOr<model::Chunk*> chunk = ChunkOf(trainer, d, s);
      imported = chunk.ok() ? (*chunk)->ImportOptimizerState(state, info.step) : chunk.status();
    }
  }
  if (!imported.ok()) return Rejected(path, std::string(imported.message()));
  PS_RETURN_IF_ERROR(trainer.set_data_cursor(info.data_cursor));
  return info;
}

}  // namespace pipesched::stages
