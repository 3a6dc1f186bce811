// Chrome / Perfetto export: parsed back, the trace has the processes, threads, complete
// events and flow pairs the Trace Event Format needs, in microseconds.
#include "pipesched/trace/chrome_trace.h"

#include <algorithm>
#include <limits>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "test_timeline.h"

namespace pipesched::trace {
namespace {

using nlohmann::json;
using ::testing::HasSubstr;

std::vector<json> Events(const json& trace, const std::string& ph) {
  std::vector<json> out;
  for (const json& e : trace.at("traceEvents")) {
    if (e.at("ph") == ph) out.push_back(e);
  }
  return out;
}

// pid -> process name, from the "process_name" metadata.
std::map<int, std::string> ProcessNames(const json& trace) {
  std::map<int, std::string> names;
  for (const json& e : Events(trace, "M")) {
    if (e.at("name") == "process_name")
      names[e.at("pid").get<int>()] = e.at("args").at("name").get<std::string>();
  }
  return names;
}

TEST(ChromeTraceTest, ProcessesThreadsAndCompleteEvents) {
  const Timeline t = testing::TwoRankTimeline();
  const json trace = json::parse(ToChromeTrace({&t}));
  ASSERT_TRUE(trace.at("traceEvents").is_array());
  EXPECT_EQ(trace.at("displayTimeUnit"), "ms");

  const std::map<int, std::string> processes = ProcessNames(trace);
  ASSERT_EQ(processes.size(), 2u);
  EXPECT_EQ(processes.begin()->second, "simulated: rank 0");
  EXPECT_EQ(processes.rbegin()->second, "simulated: rank 1");

  std::set<std::pair<int, std::string>> threads;
  for (const json& e : Events(trace, "M")) {
    if (e.at("name") == "thread_name")
      threads.insert({e.at("tid").get<int>(), e.at("args").at("name").get<std::string>()});
  }
  EXPECT_EQ(threads,
            (std::set<std::pair<int, std::string>>{
                {kComputeLane, "compute"}, {kSendLane, "send"}, {kCommLane, "collectives"}}));

  const std::vector<json> complete = Events(trace, "X");
  ASSERT_EQ(complete.size(), t.spans.size());
  // Span 5: rank 1, B of micro-batch 0 on stage 1, [2.5, 4.5) units = 1000 us per unit.
  const json& b = complete[5];
  EXPECT_EQ(b.at("name"), "1B0");
  EXPECT_EQ(b.at("cat"), "compute");
  EXPECT_EQ(processes.at(b.at("pid").get<int>()), "simulated: rank 1");
  EXPECT_EQ(b.at("tid"), kComputeLane);
  EXPECT_DOUBLE_EQ(b.at("ts").get<double>(), 2500);
  EXPECT_DOUBLE_EQ(b.at("dur").get<double>(), 2000);
  EXPECT_EQ(b.at("args"), (json{{"stage", 1}, {"microbatch", 0}, {"op", "B"}}));
  // ALLREDUCE has no micro-batch.
  EXPECT_EQ(complete[10].at("name"), "0ALLREDUCE");
  EXPECT_EQ(complete[10].at("tid"), kCommLane);
  EXPECT_FALSE(complete[10].at("args").contains("microbatch"));

  EXPECT_THAT(trace.at("otherData").dump(), HasSubstr("1 unit = 1000 us"));
}

// Two sends of rank 0 in flight at once: viewers stack a thread's slices, so two that
// overlap without nesting would be drawn over each other. The second goes to a thread
// of its own, named "send (2)", and a flow from it leaves from that thread; no thread
// holds two slices that overlap.
TEST(ChromeTraceTest, OverlappingTransfersGoToThreadsOfTheirOwn) {
  Timeline t;
  t.num_ranks = 2;
  t.spans = {{0, kComputeLane, 0, 0, "F", 0, 1},   {0, kComputeLane, 0, 1, "F", 1, 2},
             {0, kSendLane, 0, 0, "SEND_F", 1, 4}, {0, kSendLane, 0, 1, "SEND_F", 2, 5},
             {1, kComputeLane, 1, 0, "F", 4, 5},   {1, kComputeLane, 1, 1, "F", 5, 6}};
  t.flows = {{3, 5}};
  const json trace = json::parse(ToChromeTrace({&t}));
  std::map<std::pair<int, long long>, std::string> thread_names;  // (pid, tid)
  for (const json& e : Events(trace, "M")) {
    if (e.at("name") == "thread_name") {
      thread_names[{e.at("pid").get<int>(), e.at("tid").get<long long>()}] =
          e.at("args").at("name").get<std::string>();
    }
  }
  const std::vector<json> complete = Events(trace, "X");
  ASSERT_EQ(complete.size(), t.spans.size());
  const auto thread_of = [&](const json& e) {
    return std::make_pair(e.at("pid").get<int>(), e.at("tid").get<long long>());
  };
  EXPECT_EQ(thread_names.at(thread_of(complete[2])), "send");
  EXPECT_EQ(thread_names.at(thread_of(complete[3])), "send (2)");
  EXPECT_EQ(thread_of(complete[2]).first, thread_of(complete[3]).first);
  std::map<std::pair<int, long long>, std::vector<std::pair<double, double>>> slices;
  for (const json& e : complete) {
    const double ts = e.at("ts").get<double>();
    slices[thread_of(e)].push_back({ts, ts + e.at("dur").get<double>()});
  }
  for (auto& [thread, list] : slices) {
    std::sort(list.begin(), list.end());
    for (std::size_t k = 1; k < list.size(); ++k) {
      EXPECT_LE(list[k - 1].second, list[k].first) << thread_names[thread];
    }
  }
  const std::vector<json> starts = Events(trace, "s");
  ASSERT_EQ(starts.size(), 1u);
  EXPECT_EQ(thread_of(starts[0]), thread_of(complete[3]));
}

TEST(ChromeTraceTest, FlowsArePairedAndBoundToTheirSlices) {
  const Timeline t = testing::TwoRankTimeline();
  const json trace = json::parse(ToChromeTrace({&t}));
  const std::vector<json> starts = Events(trace, "s");
  const std::vector<json> finishes = Events(trace, "f");
  ASSERT_EQ(starts.size(), t.flows.size());
  ASSERT_EQ(finishes.size(), t.flows.size());
  const std::map<int, std::string> processes = ProcessNames(trace);
  for (std::size_t i = 0; i < t.flows.size(); ++i) {
    const Span& from = t.spans[t.flows[i].from];
    const Span& to = t.spans[t.flows[i].to];
    const json& s = starts[i];
    const json& f = finishes[i];
    EXPECT_EQ(s.at("id"), f.at("id"));
    EXPECT_EQ(s.at("cat"), f.at("cat"));
    EXPECT_EQ(s.at("name"), f.at("name"));
    EXPECT_EQ(f.at("bp"), "e");
    EXPECT_EQ(processes.at(s.at("pid").get<int>()), "simulated: rank " + std::to_string(from.rank));
    EXPECT_EQ(processes.at(f.at("pid").get<int>()), "simulated: rank " + std::to_string(to.rank));
    // Each end lies inside (or on the start of) the slice it binds to.
    EXPECT_GE(s.at("ts").get<double>(), from.start * 1000);
    EXPECT_LT(s.at("ts").get<double>(), from.end * 1000);
    EXPECT_DOUBLE_EQ(f.at("ts").get<double>(), to.start * 1000);
  }
  EXPECT_NE(starts[0].at("id"), starts[1].at("id"));
}

TEST(ChromeTraceTest, StacksTimelinesAndKeepsMicroseconds) {
  const Timeline planned = testing::TwoRankTimeline();
  Timeline measured = testing::TwoRankTimeline();
  measured.name = "measured";
  measured.time_unit = "us";
  measured.flows.push_back({0, 99});  // out of range: skipped, not a crash
  const json trace = json::parse(ToChromeTrace({&planned, nullptr, &measured}));
  const std::map<int, std::string> processes = ProcessNames(trace);
  ASSERT_EQ(processes.size(), 4u);
  std::vector<std::string> names;
  for (const auto& [pid, name] : processes) names.push_back(name);
  EXPECT_EQ(names, (std::vector<std::string>{"simulated: rank 0", "simulated: rank 1",
                                             "measured: rank 0", "measured: rank 1"}));
  const std::vector<json> complete = Events(trace, "X");
  ASSERT_EQ(complete.size(), 2 * planned.spans.size());
  EXPECT_DOUBLE_EQ(complete[planned.spans.size() + 5].at("ts").get<double>(), 2.5);
  EXPECT_EQ(Events(trace, "s").size(), 4u);
  EXPECT_THAT(trace.at("otherData").dump(), HasSubstr("measured (time in us)"));
}

TEST(ChromeTraceTest, EmptyInputIsAValidTrace) {
  const json trace = json::parse(ToChromeTrace({}));
  EXPECT_TRUE(trace.at("traceEvents").empty());
  EXPECT_DOUBLE_EQ(MicrosecondsPerUnit("ms"), 1000);
  EXPECT_DOUBLE_EQ(MicrosecondsPerUnit("ns"), 0.001);
}

// NaN or infinite times (or 1e308 units, infinite in microseconds) were written as
// "ts": null, which the viewers refuse: such spans and their flows are left out, counted.
TEST(ChromeTraceTest, SpansWithTimesThatAreNotFiniteAreLeftOut) {
  Timeline t = testing::TwoRankTimeline();
  t.spans[4].start = std::numeric_limits<double>::quiet_NaN();  // a flow's target
  t.spans[9].end = std::numeric_limits<double>::infinity();
  t.spans[10].end = 1e308;
  const json trace = json::parse(ToChromeTrace({&t}));
  const std::vector<json> complete = Events(trace, "X");
  EXPECT_EQ(complete.size(), t.spans.size() - 3);
  for (const json& e : trace.at("traceEvents")) {
    if (e.contains("ts")) {
      EXPECT_TRUE(e.at("ts").is_number()) << e.dump();
    }
    if (e.contains("dur")) {
      EXPECT_TRUE(e.at("dur").is_number()) << e.dump();
    }
  }
  EXPECT_EQ(Events(trace, "s").size(), 1u);  // the flow into span 4 is gone
  EXPECT_EQ(ProcessNames(trace).size(), 2u);
  EXPECT_EQ(trace.at("otherData").at("timeline 0 left out"),
            "3 spans whose times are not finite numbers of microseconds");
}

// num_ranks = 2^31 - 1 with no spans wrote a process per declared rank: minutes.
TEST(ChromeTraceTest, DeclaredRanksWithoutSpansAreWrittenUpToALimit) {
  Timeline t;
  t.num_ranks = std::numeric_limits<int>::max();
  t.spans = {{5000, kComputeLane, 0, 0, "F", 0, 1}};
  const json trace = json::parse(ToChromeTrace({&t}));
  const std::map<int, std::string> processes = ProcessNames(trace);
  EXPECT_EQ(processes.size(), 1025u);
  EXPECT_EQ(processes.rbegin()->second, "timeline 0: rank 5000");
  EXPECT_EQ(trace.at("otherData").at("timeline 0 left out"), "2147482622 ranks without spans");
  EXPECT_EQ(Events(trace, "X").size(), 1u);
}

}  // namespace
}  // namespace pipesched::trace
