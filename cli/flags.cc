#include "cli/flags.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <string>

#include "absl/flags/flag.h"
#include "absl/flags/reflection.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_replace.h"
#include "pipesched/base/strings.h"

ABSL_FLAG(std::string, schedule, "1f1b", "schedule generator name (see `pipesched schedules`)");
ABSL_FLAG(int32_t, stages, 4, "pipeline ranks P");
ABSL_FLAG(int32_t, microbatches, 8, "micro-batches per step M");
ABSL_FLAG(int32_t, virtual, 0, "chunks per rank V (0 = the schedule's default)");
ABSL_FLAG(std::string, from, "", "load the schedule from a PyTorch CSV or pipesched JSON file");
ABSL_FLAG(double, cost_f, 1.0, "time of one forward F per stage");
ABSL_FLAG(double, cost_b, 2.0, "time of one full backward B per stage");
ABSL_FLAG(double, cost_i, 1.0, "time of one backward-input I per stage");
ABSL_FLAG(double, cost_w, 1.0, "time of one backward-weight W per stage");
ABSL_FLAG(double, cost_comm, 0.0, "transfer time across a stage boundary");
ABSL_FLAG(double, cost_action_gap, 0.0,
          "a rank's stream overhead between one compute action and the next");
ABSL_FLAG(double, cost_allreduce, 0.0, "time of one stage's data-parallel all-reduce");
ABSL_FLAG(double, cost_zero_grad, 0.0,
          "time to zero one stage's gradients, once per step before its rank's first action");
ABSL_FLAG(double, cost_optimizer, 0.0,
          "time of one stage's optimizer step, once per step after its rank's last action");
ABSL_FLAG(int64_t, activation_bytes, 0, "activation bytes stashed per micro-batch per stage");
ABSL_FLAG(int64_t, workspace_bytes, 0, "scratch bytes one B or I holds while it runs, per stage");
ABSL_FLAG(int64_t, input_bytes, 0,
          "the received input's part of activation-bytes, live from the action before its F");
ABSL_FLAG(int64_t, static_bytes, 0,
          "bytes one stage holds for the whole step (parameters, gradients, optimizer state)");
ABSL_FLAG(std::string, costs, "", "cost-model JSON file with per-stage values");
ABSL_FLAG(std::string, trace, "", "write a Chrome/Perfetto trace JSON");
ABSL_FLAG(std::string, svg, "", "write an SVG timeline");
ABSL_FLAG(std::string, csv, "", "write the schedule in PyTorch's CSV format");
ABSL_FLAG(std::string, json, "", "write the statistics as JSON");
ABSL_FLAG(std::string, schedule_json, "", "write the schedule in pipesched's JSON format");
ABSL_FLAG(bool, grid, true, "print the timeline grid");
ABSL_FLAG(std::string, color, "auto", "colour the grid: auto|always|never");

namespace pipesched::cli {
namespace {

std::string Canonical(std::string_view name) {
  std::string s(name);
  std::replace(s.begin(), s.end(), '-', '_');
  return s;
}

std::string Dashed(std::string_view name) {
  std::string s(name);
  std::replace(s.begin(), s.end(), '_', '-');
  return s;
}

}  // namespace

bool IsIntegerLiteral(std::string_view text) {
  if (!text.empty() && (text[0] == '+' || text[0] == '-')) text.remove_prefix(1);
  return !text.empty() && text.find_first_not_of("0123456789") == std::string_view::npos;
}

absl::StatusOr<ParsedArgs> ParseFlags(int argc, char** argv,
                                      const std::vector<std::string_view>& allowed,
                                      bool command_follows) {
  ParsedArgs parsed;
  if (argc >= 2) parsed.command = argv[1];
  for (int i = 2; i < argc; ++i) {
    std::string arg = argv[i];
    if (arg.rfind("--", 0) != 0 || arg == "--") {
      if (arg == "--" || command_follows) {
        for (i += arg == "--" ? 1 : 0; i < argc; ++i) parsed.positional.emplace_back(argv[i]);
        break;
      }
      parsed.positional.push_back(arg);
      continue;
    }
    std::string body = arg.substr(2);
    std::string name = body;
    std::string value;
    bool has_value = false;
    if (size_t eq = body.find('='); eq != std::string::npos) {
      name = body.substr(0, eq);
      value = body.substr(eq + 1);
      has_value = true;
    }
    std::string canon = Canonical(name);
    bool negated = false;
    // An allowed entry is a flag name, or "name=registered" when the command reads a flag
    // of another type under a shared name (bench: --stages=2,4 is a list).
    auto registered = [&](const std::string& n) -> std::string {
      for (std::string_view a : allowed) {
        const std::size_t eq = a.find('=');
        if (a.substr(0, eq) == n) return std::string(eq == a.npos ? a : a.substr(eq + 1));
      }
      return "";
    };
    auto is_allowed = [&](const std::string& n) { return !registered(n).empty(); };
    absl::CommandLineFlag* flag =
        is_allowed(canon) ? absl::FindCommandLineFlag(registered(canon)) : nullptr;
    if (flag == nullptr && canon.rfind("no", 0) == 0 && is_allowed(canon.substr(2))) {
      flag = absl::FindCommandLineFlag(registered(canon.substr(2)));
      if (flag != nullptr && flag->IsOfType<bool>() && has_value) {
        const std::string positive = Dashed(canon.substr(2));
        return absl::InvalidArgumentError(absl::StrCat("--", name, " takes no value; use --no",
                                                       positive, " (= --", positive,
                                                       "=false) or --", positive));
      }
      if (flag != nullptr && flag->IsOfType<bool>()) {
        negated = true;
        canon = canon.substr(2);
      } else {
        flag = nullptr;
      }
    }
    if (flag == nullptr) {
      std::vector<std::string> names;
      for (std::string_view a : allowed) names.push_back("--" + Dashed(a.substr(0, a.find('='))));
      return absl::InvalidArgumentError(
          absl::StrCat("unknown flag --", EscapeForMessage(name, 60), " for '", parsed.command,
                       "'; it takes ", names.empty() ? "no flags" : absl::StrJoin(names, " ")));
    }
    if (!has_value) {
      if (flag->IsOfType<bool>()) {
        value = negated ? "false" : "true";
      } else if (i + 1 < argc && std::string_view(argv[i + 1]).rfind("--", 0) == 0) {
        // `--json --stages=2` would write a file named "--stages=2" and drop the flag.
        return absl::InvalidArgumentError(absl::StrCat(
            "flag --", name, " needs a value, and the next argument, ",
            EscapeForMessage(argv[i + 1], 60), ", is a flag; give --", name, "=VALUE"));
      } else if (i + 1 < argc) {
        value = argv[++i];
      } else {
        return absl::InvalidArgumentError(absl::StrCat("flag --", name, " needs a value"));
      }
    }
    // "--json=" from an empty shell variable would otherwise quietly mean "not given".
    if (value.empty()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "--", name, "= has an empty value; give one, or leave the flag out for its default"));
    }
    // The last of two values would win silently; a repeated flag is more often a slip
    // (an edited command line, a script adding its own) than a wish.
    if (std::find(parsed.flags_set.begin(), parsed.flags_set.end(), canon) !=
        parsed.flags_set.end()) {
      return absl::InvalidArgumentError(
          absl::StrCat("--", Dashed(canon), " is given twice; give it once"));
    }
    const bool is_unsigned = flag->IsOfType<std::uint32_t>() || flag->IsOfType<std::uint64_t>();
    const bool integer =
        is_unsigned || flag->IsOfType<std::int32_t>() || flag->IsOfType<std::int64_t>();
    std::string error;
    // Numbers are decimal: abseil would also take "0x10" as 16.
    const bool real = flag->IsOfType<double>();
    // A decimal number beyond a double's range would parse as inf, one too close to 0
    // for it as 0, and be reported as that.
    const double as_double =
        real && IsDecimalNumber(value) ? std::strtod(std::string(value).c_str(), nullptr) : 0;
    const bool overflows = !std::isfinite(as_double);
    const bool underflows = real && IsDecimalNumber(value) && as_double == 0 &&
                            value.substr(0, value.find_first_of("eE")).find_first_of("123456789") !=
                                std::string_view::npos;
    if ((integer && !IsIntegerLiteral(value)) || (real && !IsDecimalNumber(value)) || overflows ||
        underflows || !flag->ParseFrom(value, &error)) {
      // An integer that does not parse into an integer flag is out of its type's range.
      const bool huge = integer && IsIntegerLiteral(value);
      std::string expected = "does not parse";
      if (overflows) {
        expected = "beyond the range of a number (about 1.8e308); give a smaller one";
      } else if (underflows) {
        expected = "too close to 0 for a number (below about 4.9e-324); give 0 or a larger one";
      } else if (huge && is_unsigned && value[0] == '-') {
        expected = "expected a whole number from 0 up, in decimal digits, such as 8";
      } else if (huge) {
        expected = "far beyond any value it takes";
      } else if (integer) {
        expected = "expected a whole number in decimal digits, such as 8";
      } else if (flag->IsOfType<double>()) {
        expected = "expected a number such as 0.5 or 2";
      } else if (flag->IsOfType<bool>()) {
        expected = "expected true or false";
      } else if (!error.empty()) {
        expected = error;
      }
      return absl::InvalidArgumentError(absl::StrCat("bad value '", EscapeForMessage(value, 60),
                                                     "' for --", name, ": ", expected));
    }
    parsed.flags_set.push_back(canon);
  }
  return parsed;
}

}  // namespace pipesched::cli

// Training (`pipesched train`, `pipesched bench`).
ABSL_FLAG(int32_t, replicas, 1, "data-parallel replicas D of the pipeline");
ABSL_FLAG(int32_t, microbatch_size, 16, "samples per micro-batch B");
ABSL_FLAG(int32_t, layers, 8, "hidden blocks L of the MLP");
ABSL_FLAG(int32_t, hidden, 256, "hidden width H");
ABSL_FLAG(int32_t, inputs, 64, "input features");
ABSL_FLAG(int32_t, classes, 10, "output classes");
ABSL_FLAG(std::string, partition, "",
          "blocks per chunk, e.g. 3,3,3 (the head counts); empty = balanced by FLOPs");
ABSL_FLAG(int32_t, steps, 10, "training steps");
ABSL_FLAG(double, max_activations, 0,
          "the searched schedules: keep at most this many stages' worth of activations per "
          "rank (chunk activations / V, as compare's peak act) instead of the schedule's own "
          "limit; 0 = its own");
ABSL_FLAG(bool, refine, false,
          "the searched schedules: improve the searched order by local search (single actions "
          "moved while the step gets shorter within the same memory limit)");
ABSL_FLAG(bool, recompute, false,
          "activation recomputation: a stage drops what its F stashed and runs the F again at "
          "the start of its B or I (less activation memory, one more forward per backward); "
          "simulate and compare keep only each stage's received input, train and bench keep "
          "the executor's input and boundary buffers");
ABSL_FLAG(std::string, recompute_stages, "",
          "selective activation recomputation: the virtual stages that recompute, e.g. 0,1; "
          "simulate, train and bench also take auto: of the sets of stages whose recomputation "
          "makes every rank fit --device-memory, the one with the shortest simulated step "
          "(greedy beyond 12 candidate stages or 2^23 simulated actions; train and bench: each "
          "device with a size, GPUs "
          "shared by several ranks and the machine's memory, as the pre-flight check holds "
          "them)");
ABSL_FLAG(int32_t, search_steps, 3,
          "the searched schedules (zb-1p, zb-2p, zb-v-1p, interleaved-zb-1p, zb-v-half, "
          "zb-v-min): steps of their unit-cost order whose "
          "measured costs they are searched for before the run; 0 = keep the unit-cost order");
ABSL_FLAG(double, lr, 0.05, "learning rate");
ABSL_FLAG(std::string, optimizer, "sgd", "sgd|adamw");
ABSL_FLAG(double, momentum, 0.9, "SGD momentum");
ABSL_FLAG(double, weight_decay, 0.0, "weight decay (decoupled for AdamW)");
ABSL_FLAG(std::string, backend, "auto", "auto|host|cuda");
ABSL_FLAG(int32_t, devices, 0,
          "devices to use (host: emulated devices); 0 = one per (replica, rank) on host, all GPUs "
          "on CUDA");
ABSL_FLAG(std::string, device_memory, "",
          "memory of each device, e.g. 80GiB: the host backend then has a GPU's memory on each "
          "device, CUDA uses at most this much of each GPU; empty = the machine's / the GPU's");
ABSL_FLAG(uint64_t, seed, 0, "seed of the parameters and the synthetic data");
ABSL_FLAG(std::string, data, "", "safetensors file with x (N, inputs) F32 and y (N) I32/I64");
ABSL_FLAG(std::string, init, "", "load the parameters from a safetensors file");
ABSL_FLAG(std::string, save, "",
          "write a checkpoint (parameters with PyTorch names, optimizer state, step, data "
          "position) to a safetensors file, atomically");

// `pipesched bench` (its --stages and --microbatches are lists: see ParseFlags).
ABSL_FLAG(std::string, schedules, "gpipe,1f1b,interleaved-1f1b,zb-h1,zb-v",
          "comma-separated schedule names to sweep");
ABSL_FLAG(std::string, bench_stages, "2,4", "comma-separated pipeline ranks P to sweep");
ABSL_FLAG(std::string, bench_microbatches, "4,8,16", "comma-separated micro-batch counts M");
ABSL_FLAG(int32_t, warmup, 2, "warm-up steps per configuration, not measured");
ABSL_FLAG(std::string, md, "", "write the results as a Markdown table");
ABSL_FLAG(std::string, traces, "",
          "write each configuration's simulated and measured median step, as a "
          "Chrome/Perfetto trace and an SVG timeline, into this directory");
ABSL_FLAG(std::string, slow_stage, "",
          "S:FACTOR: pipeline rank S's stage work really takes FACTOR times longer");
