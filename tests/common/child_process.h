// Runs a program as a child process, the way the end-to-end and stress tests run programs
// under LD_PRELOAD, and parses what DELTA programs print: "key: value" lines on stdout, and
// the shim's "libdelta: stats k=v ..." line on stderr.
#pragma once

#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <fstream>
#include <map>
#include <sstream>
#include <string>
#include <vector>

extern char** environ;

namespace delta::testing {

struct ChildRun {
  int status = -1;  // exit status, or 128 + signal
  std::string out;
  std::string err;
  std::map<std::string, std::string> values;        // "key: value" lines of stdout
  std::map<std::string, unsigned long long> stats;  // the shim's stats line

  std::string value(const std::string& key) const {
    auto it = values.find(key);
    return it == values.end() ? "" : it->second;
  }
  // ~0 when absent.
  unsigned long long stat(const std::string& key) const {
    auto it = stats.find(key);
    return it == stats.end() ? ~0ull : it->second;
  }
};

inline std::string readWholeFile(const std::string& path) {
  std::ifstream in(path);
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

// This process's environment less any DELTA_*, CUDASIM_* or LD_PRELOAD setting: a test's
// child sees only what the test sets.
inline std::vector<std::string> inheritedEnvironment() {
  std::vector<std::string> env;
  for (char** e = environ; *e; ++e) {
    std::string entry = *e;
    std::string name = entry.substr(0, entry.find('='));
    if (name.rfind("DELTA_", 0) == 0 || name == "LD_PRELOAD" || name.rfind("CUDASIM_", 0) == 0)
      continue;
    env.push_back(entry);
  }
  return env;
}

// A null-terminated array of pointers into `strings`, for exec's argv and envp. `strings` must
// outlive it unchanged.
inline std::vector<char*> execArray(std::vector<std::string>& strings) {
  std::vector<char*> array;
  for (std::string& s : strings) array.push_back(s.data());
  array.push_back(nullptr);
  return array;
}

// Runs `argv` with the inherited environment (only what the test sets counts), plus `extra`
// ("NAME=value"; "NAME=" sets nothing).
inline ChildRun runChild(const std::vector<std::string>& argv,
                         const std::vector<std::string>& extra) {
  std::vector<std::string> env = inheritedEnvironment();
  for (const std::string& entry : extra)
    if (!entry.empty() && entry.back() != '=') env.push_back(entry);
  std::vector<std::string> argvCopy = argv;
  std::vector<char*> envp = execArray(env);
  std::vector<char*> args = execArray(argvCopy);

  char outPath[] = "/tmp/delta-child-out-XXXXXX";
  char errPath[] = "/tmp/delta-child-err-XXXXXX";
  int outFd = mkstemp(outPath);
  int errFd = mkstemp(errPath);
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_adddup2(&actions, outFd, 1);
  posix_spawn_file_actions_adddup2(&actions, errFd, 2);
  pid_t pid;
  ChildRun result;
  if (posix_spawn(&pid, args[0], &actions, nullptr, args.data(), envp.data()) == 0) {
    int status = 0;
    waitpid(pid, &status, 0);
    result.status = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  }
  posix_spawn_file_actions_destroy(&actions);
  close(outFd);
  close(errFd);
  result.out = readWholeFile(outPath);
  result.err = readWholeFile(errPath);
  unlink(outPath);
  unlink(errPath);

  std::istringstream lines(result.out);
  for (std::string line; std::getline(lines, line);) {
    auto colon = line.find(": ");
    if (colon != std::string::npos) result.values[line.substr(0, colon)] = line.substr(colon + 2);
  }
  // The last stats line wins (a child process of the program may print one first).
  std::istringstream errLines(result.err);
  for (std::string line; std::getline(errLines, line);) {
    if (line.rfind("libdelta: stats ", 0) != 0) continue;
    std::istringstream fields(line.substr(16));
    for (std::string field; fields >> field;) {
      auto eq = field.find('=');
      if (eq != std::string::npos)
        result.stats[field.substr(0, eq)] = std::stoull(field.substr(eq + 1));
    }
  }
  return result;
}

}  // namespace delta::testing
