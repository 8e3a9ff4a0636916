// End-to-end tests of the recompute API (delta/delta.h): train-recompute, a small framework
// that registers its activations, run on cudasim under a real LD_PRELOAD and compared with the
// same run without the shim. What must hold: the same checksum (recomputed contents are the
// contents), the platform's fault detector never fired (nothing touched a dropped buffer), and
// every failure reaches the program as a CUDA error on the touching call.
//
// Arguments (from meson): train-recompute, libdelta.so, delta-trace.
#include <gtest/gtest.h>

#include <unistd.h>

#include <cstdlib>
#include <map>
#include <regex>
#include <string>
#include <vector>

#include "tests/common/child_process.h"

namespace {

std::string gWorkload;
std::string gShim;
std::string gDeltaTrace;
std::string gProbe;

using Outcome = delta::testing::ChildRun;

// 6 layers of 2 MiB (cudasim's granularity): 6 activations + 6 weights + 6 gradients + input +
// delta buffer = 40 MiB at the peak of the forward pass; one backward step touches 10 MiB.
std::vector<std::string> workload(std::vector<std::string> extra = {}) {
  std::vector<std::string> argv = {gWorkload, "--layers", "6", "--elements", "524288",
                                   "--iters", "3", "--seed", "5"};
  argv.insert(argv.end(), extra.begin(), extra.end());
  return argv;
}

std::vector<std::string> underShim(std::vector<std::string> env) {
  env.push_back("LD_PRELOAD=" + gShim);
  env.push_back("DELTA_VERBOSE=1");
  return env;
}

const Outcome& baseline() {
  static const Outcome plain = delta::testing::runChild(workload(), {});
  return plain;
}

unsigned long long number(const Outcome& run, const std::string& key) {
  const std::string text = run.value(key);
  return text.empty() ? ~0ull : std::stoull(text);
}

void expectSameChecksum(const Outcome& shimmed) {
  const Outcome& plain = baseline();
  ASSERT_EQ(plain.status, 0) << plain.err;
  ASSERT_EQ(plain.value("shim"), "absent");
  ASSERT_EQ(shimmed.status, 0) << shimmed.err;
  EXPECT_EQ(shimmed.value("shim"), "present");
  EXPECT_EQ(shimmed.err.find("cudasim: illegal address"), std::string::npos) << shimmed.err;
  ASSERT_FALSE(plain.value("checksum").empty());
  EXPECT_EQ(shimmed.value("checksum"), plain.value("checksum"));
}

TEST(Recompute, CallbacksRegenerateDroppedActivationsBitExact) {
  // A cheap producer (4 us estimated for 2 MiB against ~170 us to copy it back): dropping wins.
  Outcome shimmed = delta::testing::runChild(workload({"--mode", "callback"}),
                                             underShim({"DELTA_BUDGET=20M"}));
  expectSameChecksum(shimmed);
  EXPECT_GT(number(shimmed, "delta_drops"), 0u) << shimmed.out;
  EXPECT_GT(number(shimmed, "delta_recomputes"), 0u) << shimmed.out;
  EXPECT_EQ(number(shimmed, "recompute_callbacks"), number(shimmed, "delta_recomputes"));
  EXPECT_EQ(number(shimmed, "delta_recompute_failures"), 0u);
  // A dropped activation's producer reads the previous activation, dropped too: the shim
  // recomputed that one first, from inside the outer callback's launch.
  EXPECT_GT(number(shimmed, "nested_recomputes"), 0u) << shimmed.out;
  EXPECT_EQ(shimmed.stat("recomputes"), number(shimmed, "delta_recomputes"));
  EXPECT_GT(shimmed.stat("recompute_ns"), 0u) << "the callbacks' device time was not measured";
}

// Launches that cannot be analysed (the driver describes no kernel's parameters, as for a
// statically linked library's kernels) "touch" every buffer, a recompute callback's launch too.
// Such work never nests a regeneration into another (each would need every other pending one
// first, nested again: play-e2e's LaunchesThatCannotBeAnalysed... shows where that led); it
// takes the pending buffers' memory, and the outer regeneration fills them oldest first. With
// every launch opaque the shim soon stops evicting what the next launch brings back (residency
// tests, ResidencyUnanalysed); with only the backward launches opaque, each of them needs the
// activations dropped in the forward pass regenerated. Bit-exact either way the framework
// regenerates.
TEST(Recompute, LaunchesThatCannotBeAnalysedStillRegenerateBitExact) {
  for (const char* fault : {"paraminfo-fail", "paraminfo-fail=layer_backward"}) {
    for (const char* mode : {"callback", "framework"}) {
      SCOPED_TRACE(std::string(fault) + " " + mode);
      Outcome shimmed = delta::testing::runChild(
          workload({"--mode", mode}),
          underShim({"DELTA_BUDGET=20M", std::string("CUDASIM_FAULTS=") + fault}));
      expectSameChecksum(shimmed);
      EXPECT_GT(shimmed.stat("unanalysed_launches"), 0u);
      EXPECT_EQ(shimmed.err.find("nested"), std::string::npos) << shimmed.err;
      EXPECT_EQ(number(shimmed, "delta_recompute_failures"), 0u);
      EXPECT_EQ(number(shimmed, "delta_recomputes"), number(shimmed, "delta_drops"));
      if (std::string(fault) != "paraminfo-fail") {
        EXPECT_GT(number(shimmed, "delta_recomputes"), 0u) << shimmed.out;
      } else if (std::string(mode) == "callback") {
        EXPECT_EQ(number(shimmed, "nested_recomputes"), 0u) << shimmed.out;
      }
    }
  }
}

TEST(Recompute, ExpensiveProducersAreSwappedInstead) {
  // The same job whose producers cost 5 s each to re-run: copying back is far cheaper, even
  // over the slow link a sanitizer's memcpy makes (the shim measures it, from the first
  // shortage on; at 50 ms a producer, TSan's link made drops the cheaper).
  Outcome shimmed = delta::testing::runChild(
      workload({"--mode", "callback", "--cost-ns", "5000000000"}), underShim({"DELTA_BUDGET=20M"}));
  expectSameChecksum(shimmed);
  EXPECT_EQ(number(shimmed, "delta_drops"), 0u) << shimmed.out;
  EXPECT_EQ(number(shimmed, "recompute_callbacks"), 0u);
  EXPECT_GT(number(shimmed, "delta_evictions"), 0u) << shimmed.out;
}

TEST(Recompute, TraceShowsBothSwapsAndRecomputes) {
  char dir[] = "/tmp/delta-recompute-trace-XXXXXX";
  ASSERT_NE(mkdtemp(dir), nullptr);
  const std::string path = std::string(dir) + "/job.trace";
  Outcome shimmed = delta::testing::runChild(
      workload({"--mode", "callback"}), underShim({"DELTA_BUDGET=20M", "DELTA_TRACE=" + path}));
  expectSameChecksum(shimmed);
  Outcome summary = delta::testing::runChild({gDeltaTrace, "summary", path}, {});
  ASSERT_EQ(summary.status, 0) << summary.err;
  std::smatch m;
  ASSERT_TRUE(std::regex_search(summary.out, m, std::regex(R"(in (\d+) recompute\(s\))")))
      << summary.out;
  EXPECT_EQ(std::stoull(m[1]), number(shimmed, "delta_recomputes"));
  ASSERT_TRUE(std::regex_search(summary.out, m, std::regex(R"(in (\d+) eviction\(s\))")))
      << summary.out;
  EXPECT_GT(std::stoull(m[1]), 0u) << "no swaps: the weights and gradients are not recomputable";
  int ignored = std::system(("rm -rf " + std::string(dir)).c_str());
  (void)ignored;
}

TEST(Recompute, FailingCallbackFailsTheTouchingCallAndCorruptsNothing) {
  // The first callback fails: the launch that needed its buffer gets a CUDA error; the
  // program retries that launch, the buffer is recomputed then, and the result is unchanged.
  Outcome shimmed = delta::testing::runChild(
      workload({"--mode", "callback", "--fail-recompute-at", "1", "--retry-failed-launches"}),
      underShim({"DELTA_BUDGET=20M"}));
  expectSameChecksum(shimmed);
  EXPECT_EQ(number(shimmed, "retried_launches"), 1u) << shimmed.out;
  EXPECT_NE(shimmed.out.find("launch_failed: "), std::string::npos) << shimmed.out;
  EXPECT_EQ(number(shimmed, "delta_recompute_failures"), 1u);
  EXPECT_NE(shimmed.err.find("recompute callback of the buffer at 0x"), std::string::npos)
      << shimmed.err;
  // Without the retry the program stops on that error, as on any failed launch.
  Outcome stops = delta::testing::runChild(
      workload({"--mode", "callback", "--fail-recompute-at", "1"}), underShim({"DELTA_BUDGET=20M"}));
  EXPECT_EQ(stops.status, 1) << stops.err;
  EXPECT_NE(stops.err.find("train-recompute: launch("), std::string::npos) << stops.err;
  EXPECT_EQ(stops.err.find("cudasim: illegal address"), std::string::npos) << stops.err;
}

TEST(Recompute, FrameworkManagedBuffersRegeneratedByTheFramework) {
  Outcome shimmed = delta::testing::runChild(workload({"--mode", "framework"}),
                                             underShim({"DELTA_BUDGET=20M"}));
  expectSameChecksum(shimmed);
  EXPECT_GT(number(shimmed, "delta_drops"), 0u) << shimmed.out;
  EXPECT_EQ(number(shimmed, "drop_notices"), number(shimmed, "delta_drops"));
  EXPECT_GT(number(shimmed, "delta_recomputes"), 0u) << shimmed.out;
  EXPECT_EQ(number(shimmed, "recompute_callbacks"), 0u);
}

TEST(Recompute, FrameworkThatForgetsToRegenerateGetsAClearError) {
  Outcome shimmed = delta::testing::runChild(
      workload({"--mode", "framework", "--forget-regenerate"}), underShim({"DELTA_BUDGET=20M"}));
  EXPECT_EQ(shimmed.status, 1) << shimmed.err;
  // One line naming the buffer and the kernel, then the program's own report of the failed call.
  EXPECT_TRUE(std::regex_search(shimmed.err,
                                std::regex("error: layer_\\w+ touches the managed buffer at 0x[0-9a-f]+ "
                                           "\\(2097152 bytes\\) whose contents were dropped")))
      << shimmed.err;
  EXPECT_NE(shimmed.err.find("delta_begin_recompute"), std::string::npos) << shimmed.err;
  EXPECT_NE(shimmed.err.find("train-recompute: launch("), std::string::npos) << shimmed.err;
  EXPECT_EQ(shimmed.err.find("cudasim: illegal address"), std::string::npos) << shimmed.err;
  EXPECT_EQ(shimmed.values.count("checksum"), 0u);
}

TEST(Recompute, NoPressureMeansNoDropsAndNoCallbacks) {
  Outcome shimmed = delta::testing::runChild(workload({"--mode", "callback"}),
                                             underShim({"DELTA_BUDGET=1G"}));
  expectSameChecksum(shimmed);
  EXPECT_EQ(number(shimmed, "delta_drops"), 0u);
  EXPECT_EQ(number(shimmed, "recompute_callbacks"), 0u);
  EXPECT_EQ(number(shimmed, "delta_evictions"), 0u);
}

TEST(Recompute, SwapOnlyPolicyNeverDrops) {
  Outcome shimmed = delta::testing::runChild(
      workload({"--mode", "callback"}), underShim({"DELTA_BUDGET=20M", "DELTA_POLICY=swap-only"}));
  expectSameChecksum(shimmed);
  EXPECT_EQ(number(shimmed, "delta_drops"), 0u);
  EXPECT_GT(number(shimmed, "delta_evictions"), 0u);
}

TEST(Recompute, SeveralThreadsNeedCallbacksAtOnce) {
  // Three replicas on three host threads and streams: callbacks are wanted by several threads
  // at once (one runs them at a time, the others wait), with nesting on each.
  const std::vector<std::string> threads = {"--mode", "callback", "--threads", "3"};
  Outcome plain = delta::testing::runChild(workload(threads), {});
  ASSERT_EQ(plain.status, 0) << plain.err;
  for (const char* mode : {"callback", "framework"}) {
    SCOPED_TRACE(mode);
    Outcome shimmed = delta::testing::runChild(
        workload({"--mode", mode, "--threads", "3"}), underShim({"DELTA_BUDGET=60M"}));
    ASSERT_EQ(shimmed.status, 0) << shimmed.err;
    EXPECT_EQ(shimmed.err.find("cudasim: illegal address"), std::string::npos) << shimmed.err;
    EXPECT_EQ(shimmed.value("checksum"), plain.value("checksum"));
    EXPECT_GT(number(shimmed, "delta_drops"), 0u) << shimmed.out;
    EXPECT_GT(number(shimmed, "delta_recomputes"), 0u) << shimmed.out;
  }
}

TEST(Recompute, EveryModeWithoutTheShimComputesTheSameResult) {
  for (const char* mode : {"none", "callback", "framework"}) {
    SCOPED_TRACE(mode);
    Outcome plain = delta::testing::runChild(workload({"--mode", mode}), {});
    ASSERT_EQ(plain.status, 0) << plain.err;
    EXPECT_EQ(plain.value("checksum"), baseline().value("checksum"));
  }
}

TEST(RecomputeApi, EdgeCases) {
  // Two registered buffers (a: callback, b: framework-managed) and two unregistered ones, 2 MiB
  // each, in a 4 MiB budget where only registered buffers may be released: see the probe.
  Outcome probe = delta::testing::runChild(
      {gProbe}, underShim({"DELTA_BUDGET=4M", "DELTA_POLICY=recompute-only"}));
  ASSERT_EQ(probe.status, 0) << probe.err << probe.out;
  EXPECT_EQ(probe.err.find("cudasim: illegal address"), std::string::npos) << probe.err;
  const std::map<std::string, std::string> expected = {
      {"api_version", "3"},
      {"register_before_active", "-1"},  // nothing managed yet
      {"notifier_before_active", "0"},   // kept for the process
      {"register_callback", "0"},
      {"register_framework", "0"},
      {"register_host_pointer", "-1"},
      {"dropped_host_pointer", "-1"},
      {"register_interior_pointer", "0"},  // names the buffer that holds it
      {"register_null_callback", "-1"},
      {"a_dropped", "1"},
      {"b_dropped", "1"},
      {"drop_notices", "1"},  // b only: a has a callback
      {"a_after_copy", "intact"},  // a copy seen through CUPTI regenerated it
      {"callbacks", "1"},
      {"misuse", "cudaErrorUnknown"},
      {"b_still_dropped", "1"},
      {"begin_b", "1"},
      {"recomputed_b", "0"},
      {"b_after_regeneration", "intact"},
      {"begin_resident_b", "0"},
      {"a_dropped_again", "1"},
      {"unregister_a", "0"},
      {"unregister_regenerated", "1"},
      {"a_after_unregister", "intact"},
      {"unregister_host_pointer", "-1"},
      {"torch_malloc", "ok"},
      {"torch_malloc_managed", "1"},
      {"torch_free_released", "1"},
      {"torch_malloc_zero", "NULL"},
      {"torch_malloc_too_big", "NULL"},  // 1 PiB: the runtime's out-of-memory, as NULL
      {"done", "yes"},
  };
  for (const auto& [key, value] : expected) EXPECT_EQ(probe.value(key), value) << key << "\n" << probe.out;
  EXPECT_NE(probe.err.find("error: fill touches the managed buffer at 0x"), std::string::npos)
      << probe.err;
  Outcome alone = delta::testing::runChild({gProbe}, {});
  EXPECT_EQ(alone.status, 0) << alone.err;
  EXPECT_EQ(alone.value("shim"), "absent");
}

}  // namespace

int main(int argc, char** argv) {
  ::testing::InitGoogleTest(&argc, argv);
  if (argc < 5) {
    std::fprintf(stderr, "usage: recompute-e2e-test TRAIN_RECOMPUTE LIBDELTA DELTA_TRACE PROBE\n");
    return 2;
  }
  gWorkload = argv[1];
  gShim = argv[2];
  gDeltaTrace = argv[3];
  gProbe = argv[4];
  return RUN_ALL_TESTS();
}
