// planner_limits SCHEDULE P V M: generates, validates and simulates one schedule (unit
// costs) and prints one line with the action count, the time of each phase and the
// process's peak resident memory (getrusage). limits.sh searches the largest P, V, M
// that stay under a memory budget. Not a benchmark of speed: see planner_bench for that.
#include <sys/resource.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>

#include "pipesched/scheduler/cost_model.h"
#include "pipesched/scheduler/registry.h"
#include "pipesched/scheduler/simulator.h"
#include "pipesched/scheduler/validate.h"

namespace {

double Seconds(std::chrono::steady_clock::time_point since) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - since).count();
}

double PeakRssMiB() {
  rusage usage{};
  getrusage(RUSAGE_SELF, &usage);
  return usage.ru_maxrss / 1024.0;  // ru_maxrss is in KiB on Linux
}

int Fail(const std::string& what) {
  std::fprintf(stderr, "planner_limits: %s\n", what.c_str());
  return 1;
}

}  // namespace

int main(int argc, char** argv) {
  using namespace pipesched::scheduler;
  if (argc != 5) return Fail("usage: planner_limits SCHEDULE P V M");
  const std::string name = argv[1];
  const GeneratorParams params{std::atoi(argv[2]), std::atoi(argv[4]), std::atoi(argv[3])};

  auto t0 = std::chrono::steady_clock::now();
  absl::StatusOr<Schedule> schedule = GenerateSchedule(name, params);
  if (!schedule.ok()) return Fail(std::string(schedule.status().message()));
  const double generate_s = Seconds(t0);

  t0 = std::chrono::steady_clock::now();
  if (absl::Status s = Validate(*schedule); !s.ok()) return Fail(std::string(s.message()));
  const double validate_s = Seconds(t0);

  t0 = std::chrono::steady_clock::now();
  absl::StatusOr<SimResult> sim = Simulate(*schedule, CostModel{});
  if (!sim.ok()) return Fail(std::string(sim.status().message()));
  const double simulate_s = Seconds(t0);

  std::printf(
      "%s P=%d V=%d M=%d actions=%zu generate=%.2fs validate=%.2fs simulate=%.2fs "
      "bubble=%.4f peak_rss_mib=%.1f\n",
      name.c_str(), schedule->num_ranks(), schedule->num_chunks(), schedule->num_microbatches,
      schedule->NumActions(), generate_s, validate_s, simulate_s, sim->bubble_fraction,
      PeakRssMiB());
  return 0;
}
