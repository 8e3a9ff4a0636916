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
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <map>
#include <sstream>
#include <string>
#include <vector>

extern char** environ;

namespace {

struct Outcome {
  int status = -1;  // exit status, or 128 + signal
  std::string out;
  std::string err;
  std::map<std::string, std::string> values;        // "key: value" lines of stdout
  std::map<std::string, unsigned long long> stats;  // "libdelta: stats k=v ..." of stderr

  unsigned long long stat(const std::string& key) const {
    auto it = stats.find(key);
    return it == stats.end() ? ~0ull : it->second;
  }
  std::string value(const std::string& key) const {
    auto it = values.find(key);
    return it == values.end() ? "" : it->second;
  }
};

std::string slurp(const std::string& path) {
  std::ifstream in(path);
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

// Runs `argv` with the runner's environment, less any DELTA_/LD_PRELOAD setting, plus `extra`.
Outcome run(const std::vector<std::string>& argv, const std::vector<std::string>& extra) {
  std::vector<std::string> env;
  for (char** e = environ; *e; ++e) {
    std::string entry = *e;
    std::string name = entry.substr(0, entry.find('='));
    if (name.rfind("DELTA_", 0) == 0 || name == "LD_PRELOAD") continue;
    env.push_back(entry);
  }
  env.insert(env.end(), extra.begin(), extra.end());
  std::vector<char*> envp, args;
  for (auto& e : env) envp.push_back(e.data());
  envp.push_back(nullptr);
  std::vector<std::string> argvCopy = argv;
  for (auto& a : argvCopy) args.push_back(a.data());
  args.push_back(nullptr);

  char outPath[] = "/tmp/delta-stress-out-XXXXXX";
  char errPath[] = "/tmp/delta-stress-err-XXXXXX";
  int outFd = mkstemp(outPath);
  int errFd = mkstemp(errPath);
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_adddup2(&actions, outFd, 1);
  posix_spawn_file_actions_adddup2(&actions, errFd, 2);
  pid_t pid;
  Outcome result;
  if (posix_spawn(&pid, args[0], &actions, nullptr, args.data(), envp.data()) == 0) {
    int status = 0;
    waitpid(pid, &status, 0);
    result.status = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  }
  posix_spawn_file_actions_destroy(&actions);
  close(outFd);
  close(errFd);
  result.out = slurp(outPath);
  result.err = slurp(errPath);
  unlink(outPath);
  unlink(errPath);

  std::istringstream lines(result.out);
  for (std::string line; std::getline(lines, line);) {
    auto colon = line.find(": ");
    if (colon != std::string::npos) result.values[line.substr(0, colon)] = line.substr(colon + 2);
  }
  std::istringstream errLines(result.err);
  for (std::string line; std::getline(errLines, line);) {
    if (line.rfind("libdelta: stats ", 0) != 0) continue;
    std::istringstream fields(line.substr(16));
    for (std::string field; fields >> field;) {
      auto eq = field.find('=');
      if (eq != std::string::npos) result.stats[field.substr(0, eq)] = std::stoull(field.substr(eq + 1));
    }
  }
  return result;
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
