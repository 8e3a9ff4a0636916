// stress-runner: runs stress-workload for one seed without the shim and then under
// libdelta.so at budgets of 10, 30, 60 and 90 % of the workload's peak, and checks each run.
//
// With --device-full, the budget is the whole device instead, and the device holds less than
// the job's peak: another process takes the job's peak of it for the middle third of the run
// (the shim finds out when the device refuses memory), or holds it from the start (the shim
// finds out from cuMemGetInfo). What is left is what the largest launch needs plus 8 MiB, so
// the job can run; the runs must give the same digest, and the first must have met a refusal.
//
// Every run must exit 0 and print "stress: ok" (the program compared every buffer with its
// shadow), the platform's fault detector must never fire ("cudasim: illegal address"), and
// the final digest must equal the unshimmed run's. Under the shim the stats line must be
// there, and the small budgets (10 and 30 %) must have evicted. Launches over budget are
// allowed (at 10 % one launch's buffers may not fit) and counted in the summary line.
//
// --policy NAME runs the shim with DELTA_POLICY=NAME (default: the shim's default, delta).
// recompute-only and dtr only drop, and there is nothing to drop here (the workload registers
// no hooks): they must keep every digest, and are not required to evict.
//
// usage: stress-runner STRESS_WORKLOAD LIBDELTA_SO SEED [--policy NAME] [--device-full]
//                      [workload arguments...]
// Exit 0 when every run passed; 1 with one line per failure otherwise.
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "tests/common/child_process.h"

namespace {

using Outcome = delta::testing::ChildRun;

// Runs `argv` with the runner's environment, less any DELTA_/CUDASIM_/LD_PRELOAD setting,
// plus `extra`.
Outcome run(const std::vector<std::string>& argv, const std::vector<std::string>& extra) {
  return delta::testing::runChild(argv, extra);
}

int gFailures = 0;
std::string gShim;
std::string gPolicy;  // DELTA_POLICY for the shim's runs; empty: the default

// The environment of a run under the shim: the library, the summary, the policy asked for.
std::vector<std::string> shimEnv(std::vector<std::string> extra) {
  extra.push_back("LD_PRELOAD=" + gShim);
  extra.push_back("DELTA_VERBOSE=1");
  if (!gPolicy.empty()) extra.push_back("DELTA_POLICY=" + gPolicy);
  return extra;
}

void fail(const std::string& run, const std::string& what, const Outcome& o) {
  ++gFailures;
  std::printf("FAIL %s: %s (exit %d)\n--- stdout\n%s--- stderr (last 4000 bytes)\n%s\n", run.c_str(),
              what.c_str(), o.status, o.out.c_str(),
              o.err.size() > 4000 ? o.err.substr(o.err.size() - 4000).c_str() : o.err.c_str());
}

// The checks every run must pass; false when one failed (already reported).
bool checkRun(const std::string& name, const Outcome& o) {
  if (o.err.find("cudasim: illegal address") != std::string::npos) {
    fail(name, "fault: the platform saw an access to unmapped device memory", o);
    return false;
  }
  if (o.out.find("stress: MISMATCH") != std::string::npos) {
    fail(name, "corruption: contents differ from the shadow", o);
    return false;
  }
  if (o.status != 0 || o.out.find("stress: ok") == std::string::npos) {
    fail(name, "did not finish with stress: ok", o);
    return false;
  }
  return true;
}

bool sameDigest(const std::string& name, const Outcome& shimmed, const Outcome& plain) {
  if (!checkRun(name, shimmed)) return false;
  if (shimmed.value("digest") != plain.value("digest")) {
    fail(name, "corruption: digest " + shimmed.value("digest") + " differs from the plain run's", shimmed);
    return false;
  }
  if (shimmed.stat("evictions") == ~0ull) {
    fail(name, "no libdelta stats line", shimmed);
    return false;
  }
  return true;
}

bool runDeviceFull(const std::vector<std::string>& command, const Outcome& plain) {
  const unsigned long long live = std::strtoull(plain.value("live_peak_bytes").c_str(), nullptr, 10);
  const unsigned long long launch =
      std::strtoull(plain.value("max_launch_mapped_bytes").c_str(), nullptr, 10);
  if (live == 0 || launch == 0) {
    fail("device-full", "no live_peak_bytes or max_launch_mapped_bytes line", plain);
    return false;
  }
  const unsigned long long left = launch + (8ull << 20);
  const std::string device = "CUDASIM_DEVICE_MEMORY=" + std::to_string(live + left);

  std::vector<std::string> midway = command;
  midway.insert(midway.end(), {"--take-device", std::to_string(live)});
  const std::string name = "device of " + std::to_string((live + left) >> 20) + " MiB, " +
                           std::to_string(live >> 20) + " MiB of it taken midway";
  const Outcome shrunk = run(midway, shimEnv({"DELTA_BUDGET=100%", device}));
  if (sameDigest(name, shrunk, plain)) {
    if (shrunk.stat("device_full") == 0)
      fail(name, "the device never refused memory: the run did not test what it is for", shrunk);
    std::printf("%s: ok evictions %llu device_full %llu ceiling_bytes %llu\n", name.c_str(),
                shrunk.stat("evictions"), shrunk.stat("device_full"), shrunk.stat("ceiling_bytes"));
  }

  const std::string startName = "device of " + std::to_string((live + left) >> 20) + " MiB, " +
                                std::to_string(live >> 20) + " MiB of it taken from the start";
  const Outcome taken =
      run(command, shimEnv({"DELTA_BUDGET=100%", device, "CUDASIM_FAULTS=device-taken=" + std::to_string(live)}));
  if (sameDigest(startName, taken, plain)) {
    if (taken.err.find("the effective ceiling") == std::string::npos)
      fail(startName, "no warning naming the effective ceiling", taken);
    else
      std::printf("%s: ok evictions %llu ceiling_bytes %llu\n", startName.c_str(),
                  taken.stat("evictions"), taken.stat("ceiling_bytes"));
  }
  std::fflush(stdout);
  return gFailures == 0;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 4) {
    std::fprintf(stderr, "usage: %s STRESS_WORKLOAD LIBDELTA_SO SEED [--policy NAME] [--device-full] [--expect-adoption] "
                 "[workload arguments...]\n", argv[0]);
    return 2;
  }
  const std::string workload = argv[1];
  gShim = argv[2];
  const std::string seed = argv[3];
  int next = 4;
  if (next + 1 < argc && std::string(argv[next]) == "--policy") {
    gPolicy = argv[next + 1];
    next += 2;
  }
  const bool deviceFull = next < argc && std::string(argv[next]) == "--device-full";
  if (deviceFull) ++next;
  // The workload frees and allocates the same sizes: some allocation must take over a freed
  // buffer's memory while the device still uses it (the digest then checks that order).
  const bool expectAdoption = next < argc && std::string(argv[next]) == "--expect-adoption";
  if (expectAdoption) ++next;
  unsigned long long adopted = 0;
  std::vector<std::string> command = {workload, "--seed", seed};
  for (int i = next; i < argc; ++i) command.push_back(argv[i]);

  const Outcome plain = run(command, {});
  const std::string plainName = "seed " + seed + " without the shim";
  if (!checkRun(plainName, plain)) return 1;
  const unsigned long long peak = std::strtoull(plain.value("peak_live_bytes").c_str(), nullptr, 10);
  if (peak == 0 || plain.value("digest").empty()) {
    fail(plainName, "no peak_live_bytes or digest line", plain);
    return 1;
  }
  std::printf("seed %s: peak_live_bytes %llu digest %s\n", seed.c_str(), peak, plain.value("digest").c_str());
  if (deviceFull) return runDeviceFull(command, plain) ? 0 : 1;

  for (int percent : {10, 30, 60, 90}) {
    const unsigned long long budget = peak * percent / 100;
    const std::string name = "seed " + seed + " budget " + std::to_string(percent) + "% (" +
                             std::to_string(budget) + " bytes)";
    const Outcome shimmed = run(command, shimEnv({"DELTA_BUDGET=" + std::to_string(budget)}));
    if (!checkRun(name, shimmed)) continue;
    if (shimmed.value("digest") != plain.value("digest")) {
      fail(name, "corruption: digest " + shimmed.value("digest") + " differs from the plain run's", shimmed);
      continue;
    }
    if (shimmed.stat("evictions") == ~0ull) {
      fail(name, "no libdelta stats line", shimmed);
      continue;
    }
    const bool onlyDrops = gPolicy == "recompute-only" || gPolicy == "dtr";
    if (percent <= 30 && shimmed.stat("evictions") == 0 && !onlyDrops) {
      fail(name, "a budget this small must evict", shimmed);
      continue;
    }
    std::printf("%s: ok evictions %llu restores %llu bytes_to_host %llu bytes_to_device %llu "
                "over_budget_launches %llu over_budget_allocations %llu evictions_ahead %llu "
                "cancelled_evictions %llu adopted_frees %llu\n",
                name.c_str(), shimmed.stat("evictions"), shimmed.stat("restores"),
                shimmed.stat("bytes_to_host"), shimmed.stat("bytes_to_device"),
                shimmed.stat("over_budget_launches"), shimmed.stat("over_budget_allocations"),
                shimmed.stat("evictions_ahead"), shimmed.stat("cancelled_evictions"),
                shimmed.stat("adopted_frees"));
    adopted += shimmed.stat("adopted_frees");
  }
  if (expectAdoption && adopted == 0)
    fail("seed " + seed, "no allocation took over a freed buffer's memory", plain);
  std::fflush(stdout);
  return gFailures == 0 ? 0 : 1;
}
