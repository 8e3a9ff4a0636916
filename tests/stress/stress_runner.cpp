// stress-runner: runs stress-workload for one seed without the shim and then under
// libdelta.so at budgets of 10, 30, 60 and 90 % of the workload's peak, and checks each run.
//
// Every run must exit 0 and print "stress: ok" (the program compared every buffer with its
// shadow), the platform's fault detector must never fire ("cudasim: illegal address"), and
// the final digest must equal the unshimmed run's. Under the shim the stats line must be
// there, and the small budgets (10 and 30 %) must have evicted. Launches over budget are
// allowed (at 10 % one launch's buffers may not fit) and counted in the summary line.
//
// usage: stress-runner STRESS_WORKLOAD LIBDELTA_SO SEED [workload arguments...]
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

}  // namespace

int main(int argc, char** argv) {
  if (argc < 4) {
    std::fprintf(stderr, "usage: %s STRESS_WORKLOAD LIBDELTA_SO SEED [workload arguments...]\n", argv[0]);
    return 2;
  }
  const std::string workload = argv[1];
  const std::string shim = argv[2];
  const std::string seed = argv[3];
  std::vector<std::string> command = {workload, "--seed", seed};
  for (int i = 4; i < argc; ++i) command.push_back(argv[i]);

  const Outcome plain = run(command, {});
  const std::string plainName = "seed " + seed + " without the shim";
  if (!checkRun(plainName, plain)) return 1;
  const unsigned long long peak = std::strtoull(plain.value("peak_live_bytes").c_str(), nullptr, 10);
  if (peak == 0 || plain.value("digest").empty()) {
    fail(plainName, "no peak_live_bytes or digest line", plain);
    return 1;
  }
  std::printf("seed %s: peak_live_bytes %llu digest %s\n", seed.c_str(), peak, plain.value("digest").c_str());

  for (int percent : {10, 30, 60, 90}) {
    const unsigned long long budget = peak * percent / 100;
    const std::string name = "seed " + seed + " budget " + std::to_string(percent) + "% (" +
                             std::to_string(budget) + " bytes)";
    const Outcome shimmed = run(command, {"LD_PRELOAD=" + shim, "DELTA_VERBOSE=1",
                                          "DELTA_BUDGET=" + std::to_string(budget)});
    if (!checkRun(name, shimmed)) continue;
    if (shimmed.value("digest") != plain.value("digest")) {
      fail(name, "corruption: digest " + shimmed.value("digest") + " differs from the plain run's", shimmed);
      continue;
    }
    if (shimmed.stat("evictions") == ~0ull) {
      fail(name, "no libdelta stats line", shimmed);
      continue;
    }
    if (percent <= 30 && shimmed.stat("evictions") == 0) {
      fail(name, "a budget this small must evict", shimmed);
      continue;
    }
    std::printf("%s: ok evictions %llu restores %llu bytes_to_host %llu bytes_to_device %llu "
                "over_budget_launches %llu over_budget_allocations %llu\n",
                name.c_str(), shimmed.stat("evictions"), shimmed.stat("restores"),
                shimmed.stat("bytes_to_host"), shimmed.stat("bytes_to_device"),
                shimmed.stat("over_budget_launches"), shimmed.stat("over_budget_allocations"));
  }
  std::fflush(stdout);
  return gFailures == 0 ? 0 : 1;
}
