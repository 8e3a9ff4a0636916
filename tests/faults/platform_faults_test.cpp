// Faults injected by the platform (CUDASIM_FAULTS, or cudasimSetFaults from the program once
// its set-up is done), with libdelta.so in front under a budget that forces evictions.
//
// What each test checks:
// - the program sees a CUDA error only where the real driver would give it one: each faulty
//   run under the shim is compared with the same faulty run without it;
// - the shim degrades (pageable host memory, over budget, no trace, pass-through) and says so
//   in at most one line;
// - no evicted buffer is lost: fault-job checks every byte against its shadow, train-mlp's
//   checksum equals the run without the shim and without the fault.
#include <algorithm>
#include <string>
#include <vector>

#include "faults_util.h"

namespace delta::faults {
namespace {

std::vector<std::string> trainMlp() {
  return {programs().trainMlp, "--peak", "64M", "--iters", "2", "--seed", "7"};
}

const Outcome& plainTrainMlp() {
  static const Outcome outcome = run(trainMlp());
  return outcome;
}

constexpr const char* kBudget = "DELTA_BUDGET=16M";

// The run finished, every byte checked, the same result as without shim and fault, and no
// kernel or copy touched an evicted buffer.
void expectIntact(const Outcome& shimmed, const Outcome& plain) {
  ASSERT_EQ(plain.status, 0) << plain.describe();
  EXPECT_EQ(shimmed.status, 0) << shimmed.describe();
  EXPECT_EQ(shimmed.err.find("cudasim: illegal address"), std::string::npos) << shimmed.describe();
  ASSERT_FALSE(plain.value("checksum").empty()) << plain.describe();
  EXPECT_EQ(shimmed.value("checksum"), plain.value("checksum")) << shimmed.describe();
}

// One line for the fault; besides it, at most the once-only over-budget notice.
void expectAtMostOneMessage(const Outcome& outcome) {
  EXPECT_LE(outcome.faultMessages().size(), 1u) << outcome.describe();
}

// The line a program prints about its failing CUDA call, without the shim's lines.
std::string programError(const Outcome& outcome) {
  const auto start = outcome.err.find("error: ");
  if (start == std::string::npos) return "";
  return outcome.err.substr(start, outcome.err.find('\n', start) - start);
}

TEST(PlatformFaults, ControlRunEvictsAndKeepsEveryByte) {
  // Without any fault: what the runs below are compared with, and proof that they evict.
  const Outcome shimmed = run(faultJob(), {underShim({kBudget})});
  expectIntact(shimmed, plainFaultJob());
  EXPECT_GT(shimmed.stat("evictions"), 10u) << shimmed.describe();
  EXPECT_GT(shimmed.stat("restores"), 10u) << shimmed.describe();
  EXPECT_TRUE(shimmed.shimMessages().empty()) << shimmed.describe();
}

TEST(PlatformFaults, DeviceFullAtAllocationLeavesBuffersUnmanaged) {
  // cuMemCreate fails from the fourth call on; cuMemAlloc (what the program would have used
  // without the shim) still works: the shim must hand such allocations to the runtime.
  const std::string fault = "CUDASIM_FAULTS=memcreate-fail-after=3";
  const Outcome plain = run(faultJob(), {{fault}});
  expectIntact(plain, plainFaultJob());  // the program never calls cuMemCreate itself
  const Outcome shimmed = run(faultJob(), {underShim({kBudget, fault})});
  expectIntact(shimmed, plainFaultJob());
  expectAtMostOneMessage(shimmed);
}

TEST(PlatformFaults, DeviceFullForOneRestore) {
  // Once the program's buffers exist, the next cuMemCreate fails: that is a restore's (the
  // shim gave the victims' memory back to the device, and another process took it). The
  // device has room again at once.
  const std::vector<std::string> extra = {"--faults-after-setup", "memcreate-fail-after=0:1"};
  const Outcome plain = run(faultJob(extra));
  expectIntact(plain, plainFaultJob());
  const Outcome shimmed = run(faultJob(extra), {underShim({kBudget})});
  expectIntact(shimmed, plainFaultJob());
  expectAtMostOneMessage(shimmed);
}

TEST(PlatformFaults, AnotherProcessHoldsMostOfTheDevice) {
  // 64 MiB device, 40 MiB of it held by another process: the job (40 MiB) does not fit.
  const std::vector<std::string> device = {"CUDASIM_DEVICE_MEMORY=64M",
                                           "CUDASIM_FAULTS=device-taken=40M"};
  const Outcome plain = run(faultJob(), {device});
  EXPECT_EQ(plain.status, 1) << plain.describe();
  EXPECT_NE(plain.err.find("cudaErrorMemoryAllocation"), std::string::npos) << plain.describe();
  // Under a budget that fits in what is left, the shim makes it fit.
  std::vector<std::string> env = device;
  env.push_back(kBudget);
  const Outcome fits = run(faultJob(), {underShim(env)});
  expectIntact(fits, plainFaultJob());
  EXPECT_GT(fits.stat("evictions"), 0u) << fits.describe();
  // Under the default budget (90 % of the device, more than is left), the device fills up
  // first: then the program gets the out-of-memory error it would get without the shim, or
  // the shim makes room and it completes; never anything else.
  const Outcome tooBig = run(faultJob(), {underShim(device)});
  EXPECT_EQ(tooBig.err.find("cudasim: illegal address"), std::string::npos) << tooBig.describe();
  if (tooBig.status == 0) {
    EXPECT_EQ(tooBig.value("checksum"), plainFaultJob().value("checksum"));
  } else {
    EXPECT_EQ(tooBig.status, plain.status) << tooBig.describe();
    EXPECT_EQ(programError(tooBig), programError(plain)) << tooBig.describe();
  }
  expectAtMostOneMessage(tooBig);
}

TEST(PlatformFaults, OneEvictionCopyFails) {
  // After set-up, the first device-to-host copy fails. Under the shim that is its first
  // eviction copy: the buffer must stay resident and the job go on. Without the shim it is
  // the program's own first copy back, and the program sees the error.
  const std::vector<std::string> extra = {"--faults-after-setup", "dtoh-fail-after=0:1"};
  const Outcome plain = run(faultJob(extra));
  EXPECT_EQ(plain.status, 1) << plain.describe();
  EXPECT_NE(plain.err.find("cudaMemcpy (verify) failed"), std::string::npos) << plain.describe();
  const Outcome shimmed = run(faultJob(extra), {underShim({kBudget})});
  expectIntact(shimmed, plainFaultJob());
  ASSERT_EQ(shimmed.faultMessages().size(), 1u) << shimmed.describe();
  EXPECT_NE(shimmed.faultMessages()[0].find("eviction copy"), std::string::npos)
      << shimmed.describe();
  EXPECT_GT(shimmed.stat("evictions"), 0u) << "later evictions work" << shimmed.describe();
}

TEST(PlatformFaults, EveryDeviceToHostCopyFails) {
  // No eviction can copy anything out: the shim runs over budget, says so once, and the
  // program sees the failure of its own copies exactly as it would without the shim.
  const std::vector<std::string> extra = {"--faults-after-setup", "dtoh-fail-after=0"};
  const Outcome plain = run(faultJob(extra));
  ASSERT_EQ(plain.status, 1) << plain.describe();
  const Outcome shimmed = run(faultJob(extra), {underShim({kBudget})});
  EXPECT_EQ(shimmed.status, plain.status) << shimmed.describe();
  EXPECT_EQ(programError(shimmed), programError(plain)) << shimmed.describe();
  EXPECT_EQ(shimmed.err.find("cudasim: illegal address"), std::string::npos) << shimmed.describe();
  EXPECT_EQ(shimmed.faultMessages().size(), 1u) << shimmed.describe();
}

TEST(PlatformFaults, OneRestoreCopyFails) {
  // After set-up, the first host-to-device copy fails: under the shim, its first restore.
  const std::vector<std::string> extra = {"--faults-after-setup", "htod-fail-after=0:1"};
  const Outcome plain = run(faultJob(extra));
  expectIntact(plain, plainFaultJob());  // the program copies to the device only at set-up
  const Outcome shimmed = run(faultJob(extra), {underShim({kBudget})});
  expectIntact(shimmed, plainFaultJob());
  expectAtMostOneMessage(shimmed);
}

TEST(PlatformFaults, SlowCopiesAndStreamsChangeNoByte) {
  // Every copy 2 ms late: the shim's eviction and restore copies are still running when
  // the work that follows them is queued; any missing wait shows as wrong bytes.
  const Outcome slowCopies =
      run(faultJob(), {underShim({kBudget, "CUDASIM_FAULTS=slow-copy-us=2000"})});
  expectIntact(slowCopies, plainFaultJob());
  EXPECT_GT(slowCopies.stat("evictions"), 0u) << slowCopies.describe();
  EXPECT_TRUE(slowCopies.shimMessages().empty()) << slowCopies.describe();
  // A training job with its copy and side streams, every item of work 300 us late.
  const Outcome slowStreams =
      run(trainMlp(), {underShim({"DELTA_BUDGET=40M", "CUDASIM_FAULTS=slow-stream-us=300"})});
  expectIntact(slowStreams, plainTrainMlp());
  EXPECT_GT(slowStreams.stat("evictions"), 0u) << slowStreams.describe();
}

TEST(PlatformFaults, PinnedHostMemoryRunsOut) {
  // Every pinned allocation fails: the program's own (it sees the error and carries on with
  // pageable memory, with or without the shim) and the shim's (it pages to pageable memory).
  const std::string fault = "CUDASIM_FAULTS=hostalloc-fail-after=0";
  const Outcome plain = run(faultJob({"--own-pinned"}), {{fault}});
  expectIntact(plain, plainFaultJob());
  EXPECT_EQ(plain.value("own_pinned"), "cudaErrorMemoryAllocation") << plain.describe();
  const Outcome shimmed = run(faultJob({"--own-pinned"}), {underShim({kBudget, fault})});
  expectIntact(shimmed, plainFaultJob());
  EXPECT_EQ(shimmed.value("own_pinned"), "cudaErrorMemoryAllocation") << shimmed.describe();
  EXPECT_GT(shimmed.stat("evictions"), 0u) << shimmed.describe();
  ASSERT_EQ(shimmed.faultMessages().size(), 1u) << shimmed.describe();
  EXPECT_NE(shimmed.faultMessages()[0].find("pageable"), std::string::npos) << shimmed.describe();
}

TEST(PlatformFaults, LockedMemoryLimitLeavesTheShimPageableMemory) {
  // The system lets the process lock 6 MiB: the program's own 4 MiB staging buffer, pinned
  // first, fits; the shim's 4 MiB host copies do not, and go to pageable memory.
  const std::string fault = "CUDASIM_FAULTS=pinned-limit=6M";
  const Outcome plain = run(faultJob({"--own-pinned"}), {{fault}});
  expectIntact(plain, plainFaultJob());
  EXPECT_EQ(plain.value("own_pinned"), "ok") << plain.describe();
  const Outcome shimmed = run(faultJob({"--own-pinned"}), {underShim({kBudget, fault})});
  expectIntact(shimmed, plainFaultJob());
  EXPECT_EQ(shimmed.value("own_pinned"), "ok") << shimmed.describe();
  EXPECT_GT(shimmed.stat("evictions"), 0u) << shimmed.describe();
  ASSERT_EQ(shimmed.faultMessages().size(), 1u) << shimmed.describe();
  EXPECT_NE(shimmed.faultMessages()[0].find("pageable"), std::string::npos) << shimmed.describe();
}

TEST(PlatformFaults, HostMemoryRunsOut) {
  // After set-up the process may grow its data by 6 MiB only (RLIMIT_DATA): pinned and
  // pageable host memory both run out after an eviction or two. The shim must keep the
  // buffers it cannot page out on the device (over budget) and lose nothing. (cudasim's
  // pageable copies then go without their staging copy, as a real driver's would.)
  const std::vector<std::string> extra = {"--host-memory-left", "6"};
  const Outcome plain = run(faultJob(extra));
  expectIntact(plain, plainFaultJob());
  const Outcome shimmed = run(faultJob(extra), {underShim({kBudget})});
  expectIntact(shimmed, plainFaultJob());
  // Two steps down, each said once: pinned to pageable memory, then no host memory at all.
  const std::vector<std::string> messages = shimmed.faultMessages();
  EXPECT_LE(messages.size(), 2u) << shimmed.describe();
  for (const std::string& line : messages)
    EXPECT_TRUE(line.find("pageable") != std::string::npos ||
                line.find("host memory exhausted") != std::string::npos)
        << line << "\n" << shimmed.describe();
}

TEST(PlatformFaults, CuptiRefusesTheSubscription) {
  const std::string fault = "CUDASIM_FAULTS=cupti-subscribe-fail";
  const Outcome shimmed = run(trainMlp(), {underShim({"DELTA_BUDGET=24M", fault})});
  expectIntact(shimmed, plainTrainMlp());
  ASSERT_EQ(shimmed.shimMessages().size(), 1u) << shimmed.describe();
  EXPECT_NE(shimmed.shimMessages()[0].find("CUPTI_ERROR_NOT_INITIALIZED"), std::string::npos)
      << shimmed.describe();
  EXPECT_NE(shimmed.shimMessages()[0].find("pass-through"), std::string::npos)
      << shimmed.describe();
  EXPECT_EQ(shimmed.err.find("libdelta: stats"), std::string::npos) << "nothing was managed";
}

TEST(PlatformFaults, CuptiRefusesToEnableCallbacks) {
  // Subscribed, but no callback can be enabled: the shim would not see a single launch, so
  // managing anything would let kernels touch evicted buffers. It must pass through.
  const std::string fault = "CUDASIM_FAULTS=cupti-enable-fail";
  const Outcome shimmed = run(faultJob(), {underShim({kBudget, fault})});
  expectIntact(shimmed, plainFaultJob());
  ASSERT_EQ(shimmed.shimMessages().size(), 1u) << shimmed.describe();
  EXPECT_NE(shimmed.shimMessages()[0].find("pass-through"), std::string::npos)
      << shimmed.describe();
}

TEST(PlatformFaults, TraceOnAFullDisk) {
  // /dev/full: every write fails with ENOSPC. The job goes on; recording stops with one line.
  const Outcome full = run(faultJob(), {underShim({kBudget, "DELTA_TRACE=/dev/full",
                                                   "DELTA_TRACE_OVERWRITE=1"})});
  expectIntact(full, plainFaultJob());
  ASSERT_EQ(full.shimMessages().size(), 1u) << full.describe();
  EXPECT_NE(full.shimMessages()[0].find("No space left on device"), std::string::npos)
      << full.describe();
  EXPECT_NE(full.shimMessages()[0].find("recording stopped"), std::string::npos)
      << full.describe();
}

TEST(PlatformFaults, TraceOverTheFileSizeLimit) {
  // RLIMIT_FSIZE: a write past it fails with EFBIG and raises SIGXFSZ, whose default action
  // ends the process. The job must survive, say so once, and the trace stay readable.
  for (unsigned long long limit : {0ull, 100ull, 4096ull, 20000ull}) {
    SCOPED_TRACE("RLIMIT_FSIZE=" + std::to_string(limit));
    TempDir dir;
    RunOptions options;
    options.env = underShim({kBudget, "DELTA_TRACE=" + dir.file("job.trace")});
    options.fileSizeLimit = limit;
    const Outcome limited = run(faultJob(), options);
    expectIntact(limited, plainFaultJob());
    ASSERT_LE(limited.shimMessages().size(), 1u) << limited.describe();
    if (limited.shimMessages().size() == 1) {
      EXPECT_NE(limited.shimMessages()[0].find("too large"), std::string::npos)
          << limited.describe();
    }
    if (limit >= 4096) {
      const Outcome summary = run({programs().deltaTrace, "summary", dir.file("job.trace")});
      EXPECT_EQ(summary.signal, 0) << summary.describe();
      EXPECT_FALSE(summary.timedOut);
      EXPECT_NE(summary.out.find("peak"), std::string::npos) << summary.describe();
    }
  }
}

}  // namespace
}  // namespace delta::faults
