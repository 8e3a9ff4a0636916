// End-to-end tests of a framework's own virtual memory under the shim: train-segments keeps
// its activations as PyTorch's expandable segments do (cuMemCreate, cuMemMap into one reserved
// range, a chunk at a time; unmapped and released to empty the cache), and its weights in
// cudaMalloc buffers or in a second segment. The shim pages each of the framework's mappings
// like a managed buffer (shim/framework_memory.cpp). vmm-probe checks the handle calls one way of
// using them at a time. On cudasim, under a real LD_PRELOAD: a kernel touching memory that is not
// mapped stops cudasim with "illegal address".
//
// Arguments (from meson): train-segments, libdelta.so, delta-trace, vmm-probe.
#include <gtest/gtest.h>

#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "tests/common/child_process.h"

namespace {

std::string gTrainSegments;
std::string gShim;
std::string gDeltaTrace;
std::string gVmmProbe;

using Outcome = delta::testing::ChildRun;

std::vector<std::string> job(uint64_t seed, const std::vector<std::string>& extra = {}) {
  std::vector<std::string> argv = {gTrainSegments, "--seed", std::to_string(seed), "--steps", "6",
                                   "--layers", "8"};
  argv.insert(argv.end(), extra.begin(), extra.end());
  return argv;
}

Outcome plain(uint64_t seed, const std::vector<std::string>& extra = {}) {
  return delta::testing::runChild(job(seed, extra), {});
}

Outcome underShim(uint64_t seed, std::vector<std::string> env,
                  const std::vector<std::string>& extra = {}) {
  env.push_back("LD_PRELOAD=" + gShim);
  env.push_back("DELTA_VERBOSE=1");
  return delta::testing::runChild(job(seed, extra), env);
}

void expectSameOutput(const Outcome& reference, const Outcome& shimmed) {
  for (const auto& [key, value] : reference.values) {
    auto it = shimmed.values.find(key);
    ASSERT_NE(it, shimmed.values.end()) << key;
    EXPECT_EQ(it->second, value) << key;  // every loss and the checksum: bit-exact
  }
}

unsigned long long number(const Outcome& o, const char* key) {
  return std::strtoull(o.value(key).c_str(), nullptr, 10);
}

TEST(SegmentsEndToEnd, TheFrameworksMemoryAndManagedBuffersShareTheBudget) {
  for (uint64_t seed : {1, 2}) {
    const Outcome reference = plain(seed);
    ASSERT_EQ(reference.status, 0) << reference.err;
    const unsigned long long peak = number(reference, "peak_bytes");
    const unsigned long long segmentPeak = number(reference, "segment_peak_bytes");
    ASSERT_GT(segmentPeak, 4ull << 20) << reference.out;
    ASSERT_GT(peak, 8 * segmentPeak / 2) << reference.out;
    for (int percent : {30, 40, 60}) {
      const unsigned long long budget = peak * percent / 100;
      SCOPED_TRACE("seed " + std::to_string(seed) + ", budget " + std::to_string(percent) + "%");
      const Outcome shimmed = underShim(seed, {"DELTA_BUDGET=" + std::to_string(budget)});
      ASSERT_EQ(shimmed.status, 0) << shimmed.err;
      EXPECT_EQ(shimmed.err.find("cudasim: illegal address"), std::string::npos) << shimmed.err;
      expectSameOutput(reference, shimmed);
      EXPECT_EQ(shimmed.stat("over_budget_launches"), 0u) << shimmed.err;
      EXPECT_EQ(shimmed.stat("over_budget_allocations"), 0u) << shimmed.err;
      EXPECT_GT(shimmed.stat("evictions"), 0u);
      // Every chunk of every cache refill was seen and counted, and what the budget covers
      // (managed resident plus the framework's own) never went over it.
      EXPECT_GE(shimmed.stat("foreign_handles"), 6u * segmentPeak / (2u << 20) / 3);
      EXPECT_EQ(shimmed.stat("program_mappings"), shimmed.stat("foreign_handles"));
      EXPECT_LE(shimmed.stat("foreign_peak_bytes"), segmentPeak);
      EXPECT_LE(shimmed.stat("peak_device_bytes"), budget);
      EXPECT_NE(shimmed.err.find("the program creates physical memory itself"), std::string::npos)
          << shimmed.err;
    }
  }
}

// Everything in segments, as PyTorch keeps it: the parameters in one mapped once, the
// activations in one grown and emptied; blocks of 768 KiB straddle the 2 MiB chunks, and the job
// declares each (as a framework hook would). The framework's own mappings are what is paged.
TEST(SegmentsEndToEnd, EverythingInSegmentsIsPagedMappingByMapping) {
  const std::vector<std::string> layout = {"--params-in-segment", "1", "--declare", "1",
                                           "--activation", "768K"};
  for (uint64_t seed : {1, 2}) {
    const Outcome reference = plain(seed, layout);
    ASSERT_EQ(reference.status, 0) << reference.err;
    const unsigned long long peak = number(reference, "peak_bytes");
    ASSERT_EQ(number(reference, "segment_peak_bytes"), peak);  // nothing but segments
    for (int percent : {30, 40, 60}) {
      const unsigned long long budget = peak * percent / 100;
      SCOPED_TRACE("seed " + std::to_string(seed) + ", budget " + std::to_string(percent) + "%");
      const Outcome shimmed =
          underShim(seed, {"DELTA_BUDGET=" + std::to_string(budget)}, layout);
      ASSERT_EQ(shimmed.status, 0) << shimmed.err;
      EXPECT_EQ(shimmed.err.find("cudasim: illegal address"), std::string::npos) << shimmed.err;
      expectSameOutput(reference, shimmed);
      EXPECT_EQ(shimmed.stat("over_budget_launches"), 0u) << shimmed.err;
      EXPECT_EQ(shimmed.stat("over_budget_allocations"), 0u) << shimmed.err;
      EXPECT_LE(shimmed.stat("peak_device_bytes"), budget);
      EXPECT_GT(shimmed.stat("evictions"), 0u);
      EXPECT_GT(shimmed.stat("restores"), 0u);
      // The 24 parameter chunks and each cache refill's, all managed; none pinned.
      EXPECT_GE(shimmed.stat("program_mappings"), 24u + 4u);
      EXPECT_EQ(shimmed.stat("program_pinned"), 0u);
    }
  }
}

// Large segments grow 20 MiB at a time, as PyTorch's do for large blocks: a mapping holds many
// activations, and is paged whole.
TEST(SegmentsEndToEnd, TwentyMiBChunksArePagedWhole) {
  const std::vector<std::string> layout = {"--chunk", "20M", "--activation", "1536K"};
  const Outcome reference = plain(5, layout);
  ASSERT_EQ(reference.status, 0) << reference.err;
  const unsigned long long peak = number(reference, "peak_bytes");
  for (int percent : {40, 60}) {
    const unsigned long long budget = peak * percent / 100;
    SCOPED_TRACE("budget " + std::to_string(percent) + "%");
    const Outcome shimmed = underShim(5, {"DELTA_BUDGET=" + std::to_string(budget)}, layout);
    ASSERT_EQ(shimmed.status, 0) << shimmed.err;
    EXPECT_EQ(shimmed.err.find("cudasim: illegal address"), std::string::npos) << shimmed.err;
    expectSameOutput(reference, shimmed);
    EXPECT_EQ(shimmed.stat("over_budget_launches"), 0u) << shimmed.err;
    EXPECT_LE(shimmed.stat("peak_device_bytes"), budget);
    EXPECT_GT(shimmed.stat("program_mappings"), 0u);
  }
}

// Without declarations a pointer reaches to the end of its run of mappings: still bit-exact and
// never a fault, but a kernel on the first parameter holds all of them, over a short budget
// (counted), and with the whole segment in budget nothing moves.
TEST(SegmentsEndToEnd, WithoutDeclarationsAPointerReachesTheRestOfItsRun) {
  const std::vector<std::string> layout = {"--params-in-segment", "1", "--activation", "768K"};
  const Outcome reference = plain(3, layout);
  ASSERT_EQ(reference.status, 0) << reference.err;
  const unsigned long long peak = number(reference, "peak_bytes");
  const Outcome shimmed =
      underShim(3, {"DELTA_BUDGET=" + std::to_string(peak * 30 / 100)}, layout);
  ASSERT_EQ(shimmed.status, 0) << shimmed.err;
  EXPECT_EQ(shimmed.err.find("cudasim: illegal address"), std::string::npos) << shimmed.err;
  expectSameOutput(reference, shimmed);
  EXPECT_GT(shimmed.stat("over_budget_launches"), 0u);
  EXPECT_GT(shimmed.stat("evictions"), 0u);
  const Outcome roomy = underShim(3, {"DELTA_BUDGET=" + std::to_string(peak)}, layout);
  ASSERT_EQ(roomy.status, 0) << roomy.err;
  expectSameOutput(reference, roomy);
  EXPECT_EQ(roomy.stat("evictions"), 0u);
  EXPECT_EQ(roomy.stat("over_budget_launches"), 0u);
}

// The handle calls, one way of using them per run, every mapping evicted before the call under
// test (vmm-probe fills DELTA_BUDGET with its own buffers): what kernels read is checked there.
TEST(SegmentsEndToEnd, HandleCallsAnswerAsTheDriversWhateverWasEvicted) {
  const Outcome list = delta::testing::runChild({gVmmProbe, "list"}, {});
  ASSERT_EQ(list.status, 0) << list.err;
  std::vector<std::string> scenarios;
  for (size_t at = 0, end; (end = list.out.find('\n', at)) != std::string::npos; at = end + 1)
    scenarios.push_back(list.out.substr(at, end - at));
  ASSERT_GE(scenarios.size(), 8u);
  for (const std::string& scenario : scenarios) {
    SCOPED_TRACE(scenario);
    if (scenario == "bad-input") continue;  // below
    const Outcome bare = delta::testing::runChild({gVmmProbe, scenario}, {});
    EXPECT_EQ(bare.status, 0) << bare.err;
    const Outcome shimmed = delta::testing::runChild(
        {gVmmProbe, scenario}, {"LD_PRELOAD=" + gShim, "DELTA_BUDGET=12M"});
    ASSERT_EQ(shimmed.status, 0) << shimmed.err;
    EXPECT_EQ(shimmed.err.find("cudasim: illegal address"), std::string::npos) << shimmed.err;
    EXPECT_EQ(shimmed.value(scenario), "ok");
    EXPECT_GT(std::strtoull(shimmed.value("evictions").c_str(), nullptr, 10), 0u) << shimmed.out;
  }
}

// What the driver refuses, the shim's stand-ins refuse the same way; memory of another device
// (an ordinal the shim does not manage) or of the host goes to the driver as it is. (cudasim has
// one device: the other ordinal is refused by the driver, not by the shim.)
TEST(SegmentsEndToEnd, BadInputGetsTheDriversAnswers) {
  const Outcome bare = delta::testing::runChild({gVmmProbe, "bad-input"}, {});
  ASSERT_EQ(bare.status, 0) << bare.err;
  const Outcome shimmed = delta::testing::runChild(
      {gVmmProbe, "bad-input"}, {"LD_PRELOAD=" + gShim, "DELTA_BUDGET=12M"});
  ASSERT_EQ(shimmed.status, 0) << shimmed.err;
  size_t answers = 0;
  for (const auto& [key, value] : bare.values) {
    if (key.rfind("answer_", 0) != 0) continue;
    ++answers;
    EXPECT_EQ(shimmed.value(key), value) << key;
  }
  EXPECT_GE(answers, 16u);
}

// With room to spare, the framework's memory is counted and nothing moves.
TEST(SegmentsEndToEnd, WithoutAShortBudgetNothingMoves) {
  const Outcome reference = plain(3);
  ASSERT_EQ(reference.status, 0) << reference.err;
  const Outcome shimmed = underShim(3, {"DELTA_BUDGET=1G"});
  ASSERT_EQ(shimmed.status, 0) << shimmed.err;
  EXPECT_EQ(shimmed.value("checksum"), reference.value("checksum"));
  EXPECT_EQ(shimmed.stat("evictions"), 0u);
  EXPECT_GT(shimmed.stat("foreign_handles"), 0u);
}

// DELTA_TRACE_STACKS=1: each managed allocation's call stack is in the trace, the shim's own
// frames left out, and `delta-trace summary` ranks the sites. train-segments allocates its
// weights, gradients and momenta at three call sites, 8 layers each.
TEST(SegmentsEndToEnd, AllocationCallStacksNameTheProgramsSites) {
  const std::string trace = ::testing::TempDir() + "segments-stacks.trace";
  std::remove(trace.c_str());
  const Outcome shimmed = underShim(1, {"DELTA_BUDGET=1G", "DELTA_TRACE=" + trace,
                                        "DELTA_TRACE_STACKS=1"});
  ASSERT_EQ(shimmed.status, 0) << shimmed.err;
  const Outcome summary = delta::testing::runChild({gDeltaTrace, "summary", trace}, {});
  ASSERT_EQ(summary.status, 0) << summary.err;
  const size_t sites = summary.out.find("top allocation sites");
  ASSERT_NE(sites, std::string::npos) << summary.out;
  const std::string table = summary.out.substr(sites, summary.out.find("\nfile\n", sites) - sites);
  size_t rows = 0;
  for (size_t at = table.find("8 allocation(s)  train-segments+"); at != std::string::npos;
       at = table.find("8 allocation(s)  train-segments+", at + 1))
    ++rows;
  EXPECT_EQ(rows, 3u) << table;
  EXPECT_EQ(table.find("libdelta"), std::string::npos) << table;
  std::remove(trace.c_str());
}

}  // namespace

int main(int argc, char** argv) {
  testing::InitGoogleTest(&argc, argv);
  if (argc != 5) {
    std::fprintf(stderr, "usage: %s TRAIN_SEGMENTS LIBDELTA_SO DELTA_TRACE VMM_PROBE\n", argv[0]);
    return 2;
  }
  gTrainSegments = argv[1];
  gShim = argv[2];
  gDeltaTrace = argv[3];
  gVmmProbe = argv[4];
  return RUN_ALL_TESTS();
}
