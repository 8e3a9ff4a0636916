// Helpers of the fault, bad-input and process tests (tests/faults): the programs under test
// (given on the command line by meson), child processes with a time limit, resource limits
// and a live view of their output, and what the shim prints.
#pragma once

#include <gtest/gtest.h>

#include <optional>
#include <string>
#include <map>
#include <utility>
#include <vector>

namespace delta::faults {

// Paths from the command line (faults_main.cpp).
struct Programs {
  std::string faultJob;
  std::string trainMlp;
  std::string shim;
  std::string deltaTrace;
};
const Programs& programs();

struct RunOptions {
  RunOptions() = default;
  // Implicit: run(argv, {"NAME=value", ...}) is the common case.
  RunOptions(std::vector<std::string> environment) : env(std::move(environment)) {}

  // Added to this process's environment, from which every DELTA_*, CUDASIM_* and LD_PRELOAD
  // setting is first removed: only what a test sets counts.
  std::vector<std::string> env;
  int timeoutSeconds = 60;                  // then SIGKILL, and timedOut is set
  std::optional<unsigned long long> fileSizeLimit;  // soft RLIMIT_FSIZE of the child
};

struct Outcome {
  int status = -1;  // exit status, or 128 + signal
  int signal = 0;   // the signal that ended it, or 0
  bool timedOut = false;
  std::string out;
  std::string err;
  std::map<std::string, std::string> values;        // "key: value" lines of stdout
  std::map<std::string, unsigned long long> stats;  // the shim's last "libdelta: stats" line

  std::string value(const std::string& key) const;
  unsigned long long stat(const std::string& key) const;  // ~0 when absent
  // Lines of stderr that start with "libdelta: ", except the verbose listing, summary and
  // stats lines (DELTA_VERBOSE=1): the shim's warnings and errors.
  std::vector<std::string> shimMessages() const;
  // The same, less the once-only notice that a launch or allocation runs over budget: what
  // a fault that keeps buffers on the device leads to, said once by design.
  std::vector<std::string> faultMessages() const;
  // Everything a test prints when it fails.
  std::string describe() const;
};

// Runs argv[0] (a path) with `options` and waits for it.
Outcome run(const std::vector<std::string>& argv, const RunOptions& options = {});

// fault-job with 10 buffers of 4 MiB, every one touched each round (a 16 MiB budget holds
// four), plus `extra`; and its outcome without the shim or any fault, run once.
std::vector<std::string> faultJob(std::vector<std::string> extra = {});
const Outcome& plainFaultJob();

// A child process whose stdout is read as it is written.
class LiveProcess {
 public:
  LiveProcess(const std::vector<std::string>& argv, const RunOptions& options);
  ~LiveProcess();
  LiveProcess(const LiveProcess&) = delete;
  LiveProcess& operator=(const LiveProcess&) = delete;

  // Waits up to `seconds` for a whole stdout line equal to `line`; false if it did not come.
  bool waitForLine(const std::string& line, int seconds);
  void signal(int number);
  // Waits for the end (SIGKILL after options.timeoutSeconds) and collects the output.
  Outcome finish();

 private:
  // Reads what is there within `timeoutMs`; false when both outputs are closed.
  bool readSome(int timeoutMs);

  int pid_ = -1;
  int outPipe_ = -1;
  int errPipe_ = -1;
  std::string out_;
  std::string err_;
  int timeoutSeconds_;
};

// The plain environment of the programs under the shim, with a budget and DELTA_VERBOSE=1.
std::vector<std::string> underShim(std::vector<std::string> env);

// A fresh temporary directory, removed with everything in it when the object goes.
class TempDir {
 public:
  TempDir();
  ~TempDir();
  const std::string& path() const { return path_; }
  std::string file(const std::string& name) const { return path_ + "/" + name; }

 private:
  std::string path_;
};

std::string readFile(const std::string& path);
void writeFile(const std::string& path, const std::string& bytes);
bool fileExists(const std::string& path);

// The trace files in `dir` (names ending in ".trace").
std::vector<std::string> traceFiles(const std::string& dir);

}  // namespace delta::faults
