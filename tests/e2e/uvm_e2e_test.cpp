// End-to-end tests of DELTA_MODE=uvm, the Unified Memory baseline (shim/uvm_mode.h), on
// cudasim under a real LD_PRELOAD: the same results as without the shim, and allocations that
// really are managed memory, advised to prefer the device and prefetched to it.
//
// Arguments (from meson): train-mlp, libdelta.so, managed-probe.
#include <gtest/gtest.h>

#include <cstdio>
#include <string>
#include <vector>

#include "tests/common/child_process.h"

namespace {

std::string gWorkload;
std::string gShim;
std::string gProbe;

using Outcome = delta::testing::ChildRun;
constexpr unsigned long long kMiB = 1ull << 20;

std::vector<std::string> workload(const std::string& peak, int threads = 1) {
  return {gWorkload, "--peak", peak, "--iters", "3", "--seed", "5", "--threads",
          std::to_string(threads)};
}

std::vector<std::string> underUvm(const std::string& budget) {
  return {"LD_PRELOAD=" + gShim, "DELTA_MODE=uvm", "DELTA_BUDGET=" + budget, "DELTA_VERBOSE=1"};
}

void expectSameResults(const Outcome& shimmed, const Outcome& plain) {
  ASSERT_EQ(plain.status, 0) << plain.err;
  ASSERT_EQ(shimmed.status, 0) << shimmed.err;
  EXPECT_EQ(shimmed.err.find("cudasim: illegal address"), std::string::npos) << shimmed.err;
  ASSERT_FALSE(plain.value("checksum").empty());
  for (const auto& [key, value] : plain.values) {
    if (key.rfind("loss", 0) != 0 && key.rfind("grad_norm", 0) != 0 &&
        key.rfind("checksum", 0) != 0)
      continue;
    auto it = shimmed.values.find(key);
    ASSERT_NE(it, shimmed.values.end()) << key;
    EXPECT_EQ(it->second, value) << key;
  }
}

TEST(UvmMode, TrainMlpGivesTheSameResultsWithManagedMemory) {
  // A budget well below the job's peak: managed memory is not held to it (the driver pages
  // it), so the job runs, and its results must not change.
  Outcome plain = delta::testing::runChild(workload("64M"), {});
  Outcome shimmed = delta::testing::runChild(workload("64M"), underUvm("24M"));
  expectSameResults(shimmed, plain);
  EXPECT_EQ(shimmed.stat("mode_uvm"), 1u) << shimmed.err;
  EXPECT_EQ(shimmed.stat("budget_bytes"), 24 * kMiB);
  EXPECT_GT(shimmed.stat("managed_allocations"), 10u) << shimmed.err;
  EXPECT_EQ(shimmed.stat("managed_frees"), shimmed.stat("managed_allocations"));
  EXPECT_GE(shimmed.stat("peak_managed_bytes"), 48 * kMiB) << "the job's peak was managed";
  EXPECT_EQ(shimmed.stat("fallbacks"), 0u);
  EXPECT_EQ(shimmed.stat("hint_failures"), 0u);
  // The device memory beyond the budget was taken, so that managed pages compete for it.
  EXPECT_GT(shimmed.stat("reserve_bytes"), 0u);
  // No residency manager ran: its stats line would carry peak_resident_bytes.
  EXPECT_EQ(shimmed.stat("peak_resident_bytes"), ~0ull) << shimmed.err;
}

TEST(UvmMode, SeveralHostThreads) {
  Outcome plain = delta::testing::runChild(workload("64M", 2), {});
  Outcome shimmed = delta::testing::runChild(workload("64M", 2), underUvm("32M"));
  expectSameResults(shimmed, plain);
  EXPECT_GT(shimmed.stat("managed_allocations"), 10u) << shimmed.err;
}

TEST(UvmMode, LargeAllocationsAreManagedAdvisedAndPrefetched) {
  Outcome shimmed = delta::testing::runChild({gProbe}, underUvm("64M"));
  ASSERT_EQ(shimmed.status, 0) << shimmed.err;
  EXPECT_EQ(shimmed.value("round_trip"), "ok");
  for (const char* name : {"runtime_large", "driver_large"}) {
    SCOPED_TRACE(name);
    const std::string prefix = name;
    EXPECT_EQ(shimmed.value(prefix + "_managed"), "1") << shimmed.out;
    EXPECT_EQ(shimmed.value(prefix + "_preferred_location"), "0") << shimmed.out;
    EXPECT_EQ(shimmed.value(prefix + "_last_prefetch_location"), "0") << shimmed.out;
  }
  // Below DELTA_MIN_BYTES (1 MiB): left alone.
  EXPECT_EQ(shimmed.value("runtime_small_managed"), "0") << shimmed.out;
  // The budget is what frameworks are told the device has.
  EXPECT_EQ(shimmed.value("runtime_total_bytes"), std::to_string(64 * kMiB));
  EXPECT_EQ(shimmed.value("driver_total_bytes"), std::to_string(64 * kMiB));
  EXPECT_LE(std::stoull(shimmed.value("runtime_free_bytes")), 64 * kMiB);
  EXPECT_EQ(shimmed.stat("managed_allocations"), 2u) << shimmed.err;
  EXPECT_EQ(shimmed.stat("managed_frees"), 2u) << shimmed.err;
}

TEST(UvmMode, OtherModesAndNoShimAllocatePlainMemory) {
  Outcome plain = delta::testing::runChild({gProbe}, {});
  ASSERT_EQ(plain.status, 0) << plain.err;
  EXPECT_EQ(plain.value("runtime_large_managed"), "0");
  EXPECT_EQ(plain.value("driver_large_managed"), "0");
  EXPECT_EQ(plain.value("round_trip"), "ok");
  Outcome vmm = delta::testing::runChild({gProbe}, {"LD_PRELOAD=" + gShim, "DELTA_BUDGET=64M"});
  ASSERT_EQ(vmm.status, 0) << vmm.err;
  EXPECT_EQ(vmm.value("runtime_large_managed"), "0");
  EXPECT_EQ(vmm.value("round_trip"), "ok");
  Outcome disabled = delta::testing::runChild(
      {gProbe}, {"LD_PRELOAD=" + gShim, "DELTA_MODE=uvm", "DELTA_DISABLE=1"});
  ASSERT_EQ(disabled.status, 0) << disabled.err;
  EXPECT_EQ(disabled.value("runtime_large_managed"), "0");
}

TEST(UvmMode, NoDeviceFailsExactlyAsWithoutTheShim) {
  Outcome plain = delta::testing::runChild(workload("8M"), {"CUDASIM_DEVICE_COUNT=0"});
  Outcome shimmed = delta::testing::runChild(
      workload("8M"), {"LD_PRELOAD=" + gShim, "DELTA_MODE=uvm", "CUDASIM_DEVICE_COUNT=0"});
  EXPECT_NE(plain.status, 0);
  EXPECT_EQ(shimmed.status, plain.status);
  EXPECT_EQ(shimmed.out, plain.out);
  EXPECT_EQ(shimmed.err, plain.err);
}

}  // namespace

int main(int argc, char** argv) {
  ::testing::InitGoogleTest(&argc, argv);
  if (argc < 4) {
    std::fprintf(stderr, "usage: %s TRAIN_MLP LIBDELTA_SO MANAGED_PROBE\n", argv[0]);
    return 2;
  }
  gWorkload = argv[1];
  gShim = argv[2];
  gProbe = argv[3];
  return RUN_ALL_TESTS();
}
