// The command table: adding a command is one file with its Run function and one entry here.
#include "cli/command.h"

namespace pipesched::cli {

int RunSchedules(const CommandContext& ctx);
int RunSimulate(const CommandContext& ctx);
int RunValidate(const CommandContext& ctx);
int RunVersion(const CommandContext& ctx);
int RunTrain(const CommandContext& ctx);
int RunBench(const CommandContext& ctx);
int RunCompare(const CommandContext& ctx);
int RunLaunch(const CommandContext& ctx);

namespace {
constexpr std::string_view kCostFlags[] = {
    "cost_f",          "cost_b",         "cost_i",         "cost_w",         "cost_comm",
    "cost_action_gap", "cost_allreduce", "cost_zero_grad", "cost_optimizer", "activation_bytes",
    "workspace_bytes", "input_bytes",    "static_bytes",   "costs"};
std::vector<std::string_view> With(std::vector<std::string_view> flags,
                                   std::initializer_list<std::string_view> more = {}) {
  flags.insert(flags.end(), std::begin(kCostFlags), std::end(kCostFlags));
  flags.insert(flags.end(), more.begin(), more.end());
  return flags;
}
// The model, data, optimizer and backend flags that train and bench share
// (TrainerConfigFromFlags reads them).
constexpr std::string_view kTrainingFlags[] = {
    "virtual",         "replicas",  "microbatch_size", "layers", "hidden",    "inputs",
    "classes",         "partition", "steps",           "lr",     "optimizer", "momentum",
    "weight_decay",    "backend",   "devices",         "seed",   "data",      "device_memory",
    "max_activations", "refine",    "recompute"};
std::vector<std::string_view> Training(std::initializer_list<std::string_view> first,
                                       std::initializer_list<std::string_view> more) {
  std::vector<std::string_view> flags(first);
  flags.insert(flags.end(), std::begin(kTrainingFlags), std::end(kTrainingFlags));
  flags.insert(flags.end(), more.begin(), more.end());
  return flags;
}
}  // namespace

const std::vector<Command>& AllCommands() {
  static const std::vector<Command>* commands = new std::vector<Command>{
      {"schedules",
       "schedules",
       "list the schedule generators and their constraints",
       {},
       &RunSchedules},
      {"simulate",
       "simulate [--schedule=1f1b --stages=4 --microbatches=8] [--virtual=V] [--from=FILE]\n"
       "         [--cost-f=1 --cost-b=2 --cost-i=1 --cost-w=1 --cost-comm=0 --cost-allreduce=0\n"
       "          --cost-action-gap=0 --cost-zero-grad=0 --cost-optimizer=0 --activation-bytes=0\n"
       "          --workspace-bytes=0 --input-bytes=0 --static-bytes=0 --costs=FILE.json]\n"
       "         [--device-memory=SIZE] [--max-activations=X] [--refine] [--recompute]\n"
       "         [--recompute-stages=S,S,...|auto] [--trace=F.json] [--svg=F.svg] [--csv=F.csv]\n"
       "         [--schedule-json=F.json] [--json=STATS.json] [--nogrid] "
       "[--color=auto|always|never]",
       "simulate a schedule with stage costs: grid, makespan, bubble, peak activations",
       With({"schedule", "stages", "microbatches", "virtual", "from", "trace", "svg", "csv", "json",
             "schedule_json", "grid", "color", "device_memory", "max_activations", "refine",
             "recompute", "recompute_stages"}),
       &RunSimulate},
      {"compare",
       "compare [--schedules=all|NAME,NAME,...] [--stages=4 --microbatches=8] [--virtual=V]\n"
       "        [--cost-f=1 --cost-b=2 --cost-i=1 --cost-w=1 --cost-comm=0 ... --costs=FILE.json]\n"
       "        [--device-memory=SIZE] [--max-activations=X] [--refine] [--recompute]\n"
       "        [--json=F.json] [--md=F.md] [--svg=F.svg] [--trace=F.json]",
       "rank the schedules for one model's per-stage costs at equal work: step, bubble, memory",
       With({"schedules", "stages", "microbatches", "virtual", "device_memory", "max_activations",
             "refine", "recompute", "json", "md", "svg", "trace"}),
       &RunCompare},
      {"validate",
       "validate FILE [--costs=FILE.json --cost-*=...] [--device-memory=SIZE]\n"
       "         [--json=STATS.json] [--nogrid] [--color=auto|always|never]",
       "check a PyTorch CSV or pipesched JSON schedule file; exit 0 only when valid",
       With({"json", "grid", "color", "device_memory"}), &RunValidate},
      {"train",
       "train [--schedule=1f1b --stages=4] [--virtual=V] [--replicas=1 --microbatches=8]\n"
       "      [--microbatch-size=16 --layers=8 --hidden=256 --inputs=64 --classes=10 --steps=10]\n"
       "      [--lr=0.05 --optimizer=sgd|adamw --momentum=0.9 --weight-decay=0]\n"
       "      [--backend=auto|host|cuda] [--devices=N] [--device-memory=SIZE] [--seed=S]\n"
       "      [--partition=3,3,3] [--from=SCHEDULE_FILE] [--data=F.safetensors] "
       "[--init=F.safetensors]\n"
       "      [--save=F.safetensors [--save-every=K]] [--resume=F.safetensors]\n"
       "      [--step-timeout=60] [--trace=F.json] [--svg=F.svg] [--json=F.json]\n"
       "      [--save-costs=COSTS.json] [--search-steps=3] [--max-activations=X] [--refine]\n"
       "      [--recompute | --recompute-stages=S,S,...|auto]\n"
       "      [--processes=N --process-rank=R --rendezvous=DIR | --mpi] "
       "[--rendezvous-timeout=300]\n"
       "      [--split-stages | --pipeline-processes=K]",
       "train the built-in MLP with a pipeline schedule; measured vs planned bubble",
       Training({"schedule", "stages", "microbatches", "from"},
                {"init", "save", "save_every", "resume", "step_timeout", "trace", "svg", "json",
                 "save_costs", "search_steps", "recompute_stages", "processes", "process_rank",
                 "rendezvous", "rendezvous_timeout", "mpi", "split_stages", "pipeline_processes"}),
       &RunTrain},
      {"bench",
       "bench [--schedules=gpipe,1f1b,interleaved-1f1b,zb-h1,zb-v] [--stages=2,4]\n"
       "      [--microbatches=4,8,16] [--virtual=V] [--warmup=2] [--steps=5] [--search-steps=3]\n"
       "      [--max-activations=X] [--refine] [--recompute | --recompute-stages=auto]\n"
       "      [--slow-stage=RANK:FACTOR] [--csv=F.csv] [--json=F.json] [--md=F.md] [--svg=F.svg]\n"
       "      [--traces=DIR] [--from=FILE.csv|FILE.json,...: your schedules, one configuration\n"
       "       each with its own P, V, M; with --schedules the generated ones run too]\n"
       "      [model and backend flags as in train; defaults --layers=17 --hidden=512\n"
       "       --microbatch-size=64]\n"
       "      [--processes=N --process-rank=R --rendezvous=DIR | --mpi] "
       "[--rendezvous-timeout=300]\n"
       "      [--split-stages | --pipeline-processes=K]",
       "sweep schedules x P x M: bubble closed form, simulated, replayed and measured; idle "
       "decomposed",
       Training({"schedules", "stages=bench_stages", "microbatches=bench_microbatches", "from"},
                {"warmup", "search_steps", "recompute_stages", "slow_stage", "csv", "json", "md",
                 "svg", "traces", "processes", "process_rank", "rendezvous", "rendezvous_timeout",
                 "mpi", "split_stages", "pipeline_processes"}),
       &RunBench},
      {"launch",
       "launch --processes=N [--rendezvous=DIR] [--rendezvous-timeout=300]\n"
       "       [--output=first|all] [--grace=10] [--nodes=K --node-rank=R]\n"
       "       -- train [train's flags] | -- bench [bench's flags]\n"
       "       (or -- PROGRAM [ARGS...]: a program of yours that reads PIPESCHED_PROCESSES,\n"
       "        PIPESCHED_PROCESS_RANK, PIPESCHED_RENDEZVOUS, PIPESCHED_RENDEZVOUS_TIMEOUT)",
       "start the N processes of a training job (or a bench sweep) on this host; stop them all "
       "when one fails",
       {"processes", "rendezvous", "rendezvous_timeout", "output", "grace", "nodes", "node_rank"},
       &RunLaunch,
       /*runs_a_command=*/true},
      {"version", "version", "print the version", {}, &RunVersion},
  };
  return *commands;
}

}  // namespace pipesched::cli
