#include "shim/shim.h"

#include <pthread.h>
#include <unistd.h>

#include <cstdlib>
#include <mutex>
#include <string>

#include "policy/policy_factory.h"
#include "shim/alloc_paths.h"
#include "shim/cupti_switchboard.h"
#include "shim/log.h"
#include "shim/reentry_guard.h"
#include "shim/uvm_mode.h"

extern char** environ;

namespace delta::shim {

Shim& Shim::instance() {
  // Never destroyed: interposed calls may arrive from other threads during exit.
  static Shim* shim = new Shim;
  return *shim;
}

void Shim::configure() {
  std::string error;
  if (!parseOptions(environ, options_, error)) {
    std::string line = error + "\n";
    ssize_t ignored = write(STDERR_FILENO, line.data(), line.size());
    (void)ignored;
    _exit(1);
  }
  setVerbosity(options_.verbose);
  if (options_.disabled) passThrough_.store(true);
  if (options_.verbose >= 1) {
    std::string text = describeOptions(options_);
    ssize_t ignored = write(STDERR_FILENO, text.data(), text.size());
    (void)ignored;
  }
}

Residency* Shim::activate() {
  static std::mutex mutex;
  std::lock_guard lock(mutex);
  if (Residency* residency = residency_.load()) return residency;
  if (passThrough_.load()) return nullptr;
  ReentryGuard guard;
  auto giveUp = [this](const char* why) -> Residency* {
    if (why) logLine("%s", why);
    passThrough_.store(true);
    return nullptr;
  };
  // No driver or no device: exactly what the program would see without us, so silently.
  if (!loadDriver(driver_)) return giveUp(nullptr);
  driverLoaded_.store(true, std::memory_order_release);
  if (driver_.cuInit(0) != CUDA_SUCCESS) return giveUp(nullptr);
  CUdevice device = 0;
  size_t deviceBytes = 0;
  if (driver_.cuDeviceGet(&device, 0) != CUDA_SUCCESS ||
      driver_.cuDeviceTotalMem_v2(&deviceBytes, device) != CUDA_SUCCESS)
    return giveUp(nullptr);

  uint64_t budget = 0, hostLimit = 0;
  std::string error;
  if (!resolveOptions(options_, deviceBytes, readHostMemoryBytes(), budget, hostLimit, error)) {
    std::string line = error + "\n";
    ssize_t ignored = write(STDERR_FILENO, line.data(), line.size());
    (void)ignored;
    _exit(1);
  }
  if (options_.mode == Options::Mode::kUvm) {
    // The Unified Memory baseline (uvm_mode.h) takes the allocations itself; there is no
    // residency manager and no CUPTI subscription, so everything else passes through.
    if (!startUvmMode(driver_, device, budget))
      return giveUp("DELTA_MODE=uvm: this device or driver cannot oversubscribe managed memory; "
                    "passing everything through");
    passThrough_.store(true);
    return nullptr;
  }
  CUmemAllocationProp prop{};
  prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
  prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  prop.location.id = device;
  size_t granularity = 0;
  if (driver_.cuMemGetAllocationGranularity(&granularity, &prop,
                                            CU_MEM_ALLOC_GRANULARITY_RECOMMENDED) != CUDA_SUCCESS ||
      granularity == 0)
    return giveUp("the driver does not support virtual memory management; passing everything through");

  policy::PolicyConfig policyConfig;
  policyConfig.max_buffers = 1u << 18;
  // With DELTA_PLAN=1, delta plans each learned iteration within the budget, on the planner
  // thread (planner_thread.h), never on the launch path. Off by default: on the shared traces
  // its plans gain little and lose on the LSTM (docs/shim.md, Planning).
  policyConfig.budget_bytes = options_.plan ? budget : 0;
  policyConfig.plan_elsewhere = true;
  // Once memory is short, the launch marks are timing events and delta learns the iteration
  // by the device's times (Residency::readLaunchTimes).
  policyConfig.timed_launches = true;
  policy::PolicyResult made = policy::makePolicy(options_.policy, policyConfig);
  if (!made.policy) {
    logLine("DELTA_POLICY: %s", made.error.c_str());
    _exit(1);
  }
  ResidencyConfig config;
  config.budgetBytes = budget;
  config.hostLimitBytes = hostLimit;
  config.strict = options_.strict;
  config.prefetch = options_.prefetch;
  config.traceStacks = options_.traceStacks && !options_.tracePath.empty();
  config.deviceBytes = deviceBytes;
  auto* residency = new Residency(driver_, config, std::move(made.policy), granularity);
  CuptiStatus cupti = subscribeCupti(options_.cuptiPath, driver_, *residency);
  if (!cupti.subscribed) {
    // Without seeing launches, evicting anything could let a kernel touch a missing buffer.
    delete residency;
    return giveUp(cupti.message.c_str());
  }
  logVerbose(1, "active: budget %llu MiB of %llu MiB, policy %s, host limit %llu MiB",
             (unsigned long long)(budget >> 20), (unsigned long long)(deviceBytes >> 20),
             options_.policy.c_str(), (unsigned long long)(hostLimit >> 20));
  char deviceName[256] = "";
  driver_.cuDeviceGetName(deviceName, sizeof deviceName, device);
  if (!options_.tracePath.empty()) openTrace(*residency, deviceName, deviceBytes, budget);
  pthread_atfork(nullptr, nullptr, afterForkInChild);
  std::atexit([] { Shim::instance().finish(); });
  residency_.store(residency, std::memory_order_release);
  return residency;
}

void Shim::openTrace(Residency& residency, const char* deviceName, uint64_t deviceBytes,
                     uint64_t budget) {
  trace::WriterOptions writer;
  writer.path = options_.tracePath;
  writer.overwrite = options_.traceOverwrite;
  writer.on_error = [](const char* message, void*) {
    // The writer's line already says that recording stopped and what was lost is counted.
    logLine("%s (the job goes on)", message);
  };
  trace::TraceInfo info;
  info.producer = std::string("libdelta ") + DELTA_VERSION_STRING;
  info.device_name = deviceName;
  info.device_memory = deviceBytes;
  info.budget = budget;
  info.policy = options_.policy;
  // The options in force, "DELTA_X=value" per line, as the verbose listing shows them.
  std::string described = describeOptions(options_);
  for (size_t start = 0; start < described.size();) {
    size_t end = described.find('\n', start);
    if (end == std::string::npos) end = described.size();
    std::string line = described.substr(start, end - start);
    if (line.rfind("libdelta: ", 0) == 0) line = line.substr(10);
    info.options += line.substr(0, line.find(" (default")) + "\n";
    start = end + 1;
  }
  std::string error = trace_.open(writer, info);
  if (!error.empty()) {
    logLine("DELTA_TRACE: %s; running without a trace", error.c_str());
    return;
  }
  residency.setTrace(&trace_);
}

void Shim::afterForkInChild() {
  // The child of a CUDA process cannot use CUDA; it must not write into the parent's trace
  // nor touch the parent's residency state either.
  Shim& shim = instance();
  detachCupti();
  shim.trace_.onForkChild();
  shim.passThrough_.store(true);
  shim.residency_.store(nullptr);
}

void Shim::finish() {
  Residency* residency = residency_.load();
  if (residency == nullptr) return;
  if (insideShim()) {
    // exit() called on a thread that is inside the shim: from a signal handler (a common
    // SIGINT/SIGTERM handler calls exit) that interrupted an eviction or a restore. This
    // thread holds the residency lock, and perhaps its trace buffer: the summary and the
    // trace's closing record would wait for them for ever. The trace is left as a kill
    // leaves it: readable, without its closing record.
    logLine("exit() was called inside libdelta (from a signal handler?): no summary, and the "
            "trace is left without its closing record");
    return;
  }
  if (options_.verbose >= 1) printSummary();
  if (trace_.enabled()) {
    residency->setTrace(nullptr);
    trace::WriterCounts counts = trace_.close(residency->traceTotals());
    // After a failed write the writer has said so once already; this is for a slow disk.
    if (counts.dropped > 0 && !counts.failed)
      logLine("trace: %llu records dropped (the disk was too slow)",
              (unsigned long long)counts.dropped);
  }
}

void Shim::printSummary() {
  Residency* residency = residency_.load();
  if (residency == nullptr) return;
  Stats s = residency->stats();
  auto mib = [](uint64_t bytes) { return static_cast<unsigned long long>(bytes >> 20); };
  logLine("summary: budget %llu MiB, peak resident %llu MiB, %llu buffers allocated, %llu freed",
          mib(residency->budget()), mib(s.peakResidentBytes), (unsigned long long)s.allocations,
          (unsigned long long)s.frees);
  logLine("summary: %llu evictions (%llu without a copy, %llu started ahead, %llu called off by a "
          "use), %llu restores (%llu prefetched), %llu MiB to host, %llu MiB back to device",
          (unsigned long long)s.evictions, (unsigned long long)s.cleanEvictions,
          (unsigned long long)s.evictionsAhead, (unsigned long long)s.cancelledEvictions,
          (unsigned long long)s.restores, (unsigned long long)s.prefetches, mib(s.bytesToHost),
          mib(s.bytesToDevice));
  if (s.pinnedChunks > 0)
    logLine("summary: %llu MiB of host memory pinned for evicted buffers, in %llu chunks (%llu "
            "pinned ahead, off the launch path)",
            mib(s.pinnedHostBytes), (unsigned long long)s.pinnedChunks,
            (unsigned long long)s.pinnedChunksAhead);
  if (s.drops > 0 || s.recomputes > 0 || s.recomputeFailures > 0)
    logLine("summary: %llu buffers dropped for recompute, %llu recomputed (%.3f s of device "
            "time measured), %llu recompute callbacks failed",
            (unsigned long long)s.drops, (unsigned long long)s.recomputes, s.recomputeNs / 1e9,
            (unsigned long long)s.recomputeFailures);
  if (s.deviceFull > 0 || s.ceilingBytes < residency->budget())
    logLine("summary: the device ran out of memory before the budget %llu times; effective ceiling "
            "%llu MiB (DELTA_BUDGET %llu MiB)",
            (unsigned long long)s.deviceFull, mib(s.ceilingBytes), mib(residency->budget()));
  if (s.plans > 0)
    logLine("summary: %llu plan(s) made on the planner thread in %.3f s; the last: %s%s", (unsigned long long)s.plans,
            s.planningNs / 1e9, s.planName,
            s.planPredictedNs >= 0 ? (", predicted " + std::to_string(s.planPredictedNs / 1000) + " us per iteration").c_str()
                                   : " (the iteration fits the budget)");
  if (s.planSwitches > 0)
    logLine("summary: the plan's candidate switched %llu time(s) after measuring it against the "
            "others' predictions; running: %s",
            (unsigned long long)s.planSwitches, residency->runningPlan().c_str());
  if (s.foreignHandles > 0)
    logLine("summary: the program's own physical memory (cuMemCreate): %llu handles, %llu MiB "
            "on the device now, %llu MiB at most; %llu of its mappings paged, %llu pinned, %llu "
            "extents declared now; managed and its own together at most %llu MiB",
            (unsigned long long)s.foreignHandles, mib(s.foreignBytes), mib(s.foreignPeakBytes),
            (unsigned long long)s.programMappings, (unsigned long long)s.programPinned,
            (unsigned long long)s.programExtents, mib(s.peakDeviceBytes));
  if (s.unanalysedHoldBytes > 0)
    logLine("summary: launches that could not be analysed needed up to %llu MiB resident, over "
            "the budget; while they came, evictions made room under that, not under the budget "
            "(what they needed came back at each)",
            mib(s.unanalysedHoldBytes));
  printAllocPathSummary();
  logLine("summary: %.3f s waiting for memory (the host: evictions, frees the device had not "
          "passed), %.3f s waiting for restores (the device, measured), %llu launches over "
          "budget, %llu launches not analysed, %llu pageable host fallbacks",
          s.stallNs / 1e9, s.restoreWaitNs / 1e9, (unsigned long long)s.overBudgetLaunches,
          (unsigned long long)s.unanalysedLaunches, (unsigned long long)s.pageableFallbacks);
  // The same in one machine-readable line, for scripts and tests.
  logLine("stats budget_bytes=%llu peak_resident_bytes=%llu evictions=%llu restores=%llu "
          "prefetches=%llu bytes_to_host=%llu bytes_to_device=%llu over_budget_launches=%llu "
          "over_budget_allocations=%llu unanalysed_launches=%llu stall_ns=%llu drops=%llu "
          "recomputes=%llu recompute_failures=%llu recompute_ns=%llu device_full=%llu "
          "ceiling_bytes=%llu pointer_tables=%llu evictions_ahead=%llu cancelled_evictions=%llu "
          "plans=%llu planning_ns=%llu plan_predicted_ns=%lld foreign_handles=%llu "
          "foreign_peak_bytes=%llu peak_device_bytes=%llu program_mappings=%llu "
          "program_pinned=%llu restore_wait_ns=%llu adopted_frees=%llu reused_frees=%llu "
          "unanalysed_hold_bytes=%llu pinned_host_bytes=%llu pinned_chunks=%llu "
          "pinned_chunks_ahead=%llu physical_creates=%llu physical_releases=%llu mappings=%llu "
          "plan_switches=%llu%s",
          (unsigned long long)residency->budget(), (unsigned long long)s.peakResidentBytes,
          (unsigned long long)s.evictions, (unsigned long long)s.restores,
          (unsigned long long)s.prefetches, (unsigned long long)s.bytesToHost,
          (unsigned long long)s.bytesToDevice,
          (unsigned long long)s.overBudgetLaunches, (unsigned long long)s.overBudgetAllocations,
          (unsigned long long)s.unanalysedLaunches, (unsigned long long)s.stallNs,
          (unsigned long long)s.drops, (unsigned long long)s.recomputes,
          (unsigned long long)s.recomputeFailures, (unsigned long long)s.recomputeNs,
          (unsigned long long)s.deviceFull, (unsigned long long)s.ceilingBytes,
          (unsigned long long)s.pointerTables, (unsigned long long)s.evictionsAhead,
          (unsigned long long)s.cancelledEvictions, (unsigned long long)s.plans,
          (unsigned long long)s.planningNs, (long long)s.planPredictedNs,
          (unsigned long long)s.foreignHandles, (unsigned long long)s.foreignPeakBytes,
          (unsigned long long)s.peakDeviceBytes, (unsigned long long)s.programMappings,
          (unsigned long long)s.programPinned, (unsigned long long)s.restoreWaitNs,
          (unsigned long long)s.adoptedFrees, (unsigned long long)s.reusedFrees,
          (unsigned long long)s.unanalysedHoldBytes, (unsigned long long)s.pinnedHostBytes,
          (unsigned long long)s.pinnedChunks, (unsigned long long)s.pinnedChunksAhead,
          (unsigned long long)s.physicalCreates, (unsigned long long)s.physicalReleases,
          (unsigned long long)s.mappings, (unsigned long long)s.planSwitches, allocPathStatsKeys().c_str());
}

}  // namespace delta::shim
