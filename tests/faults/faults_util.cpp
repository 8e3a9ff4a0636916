#include "faults_util.h"

#include <dirent.h>
#include <fcntl.h>
#include <poll.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <csignal>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <sstream>
#include <thread>

#include "tests/common/child_process.h"

namespace delta::faults {
namespace {

// Forks and execs argv with stdout to `outFd`, stderr to `errFd`; returns the pid (-1: failed).
// The environment is the inherited one plus options.env verbatim ("NAME=" sets NAME empty: the
// bad-option tests need that).
int spawn(const std::vector<std::string>& argv, const RunOptions& options, int outFd, int errFd) {
  std::vector<std::string> env = delta::testing::inheritedEnvironment();
  env.insert(env.end(), options.env.begin(), options.env.end());
  std::vector<std::string> argvCopy = argv;
  std::vector<char*> envp = delta::testing::execArray(env);
  std::vector<char*> args = delta::testing::execArray(argvCopy);
  const pid_t pid = fork();
  if (pid != 0) return pid;
  // The child: only async-signal-safe calls from here to exec.
  dup2(outFd, 1);
  dup2(errFd, 2);
  int devNull = open("/dev/null", O_RDONLY);
  if (devNull >= 0) dup2(devNull, 0);
  if (options.fileSizeLimit) {
    // The soft limit, as `ulimit -S -f` sets it; the hard one stays.
    rlimit limit{};
    getrlimit(RLIMIT_FSIZE, &limit);
    limit.rlim_cur = *options.fileSizeLimit;
    setrlimit(RLIMIT_FSIZE, &limit);
  }
  execve(args[0], args.data(), envp.data());
  _exit(127);
}

// Waits for `pid` up to `seconds`, then kills it. Fills status, signal and timedOut.
void reap(int pid, int seconds, Outcome& outcome) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(seconds);
  int status = 0;
  for (;;) {
    const pid_t done = waitpid(pid, &status, WNOHANG);
    if (done == pid) break;
    if (std::chrono::steady_clock::now() > deadline) {
      kill(pid, SIGKILL);
      waitpid(pid, &status, 0);
      outcome.timedOut = true;
      break;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  if (WIFEXITED(status)) {
    outcome.status = WEXITSTATUS(status);
  } else if (WIFSIGNALED(status)) {
    outcome.signal = WTERMSIG(status);
    outcome.status = 128 + outcome.signal;
  }
}

void parseOutput(Outcome& outcome) {
  std::istringstream lines(outcome.out);
  for (std::string line; std::getline(lines, line);) {
    const auto colon = line.find(": ");
    if (colon != std::string::npos) outcome.values[line.substr(0, colon)] = line.substr(colon + 2);
  }
  std::istringstream errLines(outcome.err);
  for (std::string line; std::getline(errLines, line);) {
    if (line.rfind("libdelta: stats ", 0) != 0) continue;
    outcome.stats.clear();
    std::istringstream fields(line.substr(16));
    for (std::string field; fields >> field;) {
      const auto eq = field.find('=');
      if (eq != std::string::npos)
        outcome.stats[field.substr(0, eq)] = std::stoull(field.substr(eq + 1));
    }
  }
}

}  // namespace

std::string Outcome::value(const std::string& key) const {
  auto it = values.find(key);
  return it == values.end() ? "" : it->second;
}

unsigned long long Outcome::stat(const std::string& key) const {
  auto it = stats.find(key);
  return it == stats.end() ? ~0ull : it->second;
}

std::vector<std::string> Outcome::shimMessages() const {
  std::vector<std::string> messages;
  std::istringstream lines(err);
  for (std::string line; std::getline(lines, line);) {
    if (line.rfind("libdelta: ", 0) != 0) continue;
    const std::string body = line.substr(10);
    // DELTA_VERBOSE=1: the options in force ("DELTA_X=value ..."), "active: ...", the summary
    // and the stats line.
    const size_t name = body.find_first_not_of("ABCDEFGHIJKLMNOPQRSTUVWXYZ_");
    const bool optionLine = body.rfind("DELTA_", 0) == 0 && name != std::string::npos &&
                            body[name] == '=';
    if (optionLine || body.rfind("summary: ", 0) == 0 || body.rfind("stats ", 0) == 0 ||
        body.rfind("active: ", 0) == 0)
      continue;
    messages.push_back(line);
  }
  return messages;
}

std::vector<std::string> Outcome::faultMessages() const {
  std::vector<std::string> messages = shimMessages();
  std::erase_if(messages, [](const std::string& line) {
    return line.find("running it over budget") != std::string::npos ||
           line.find("allocating over budget") != std::string::npos;
  });
  return messages;
}

std::string Outcome::describe() const {
  std::string text = "status " + std::to_string(status);
  if (timedOut) text += " (timed out)";
  return text + "\n--- stdout:\n" + out + "--- stderr:\n" + err;
}

Outcome run(const std::vector<std::string>& argv, const RunOptions& options) {
  LiveProcess process(argv, options);
  return process.finish();
}

// Both outputs are pipes, not files: a child under a file size limit (RLIMIT_FSIZE) must be
// able to write them.
LiveProcess::LiveProcess(const std::vector<std::string>& argv, const RunOptions& options)
    : timeoutSeconds_(options.timeoutSeconds) {
  int out[2], err[2];
  if (pipe2(out, O_CLOEXEC) != 0) return;
  if (pipe2(err, O_CLOEXEC) != 0) {
    close(out[0]);
    close(out[1]);
    return;
  }
  pid_ = spawn(argv, options, out[1], err[1]);
  close(out[1]);
  close(err[1]);
  outPipe_ = out[0];
  errPipe_ = err[0];
}

LiveProcess::~LiveProcess() {
  if (pid_ > 0) {
    kill(pid_, SIGKILL);
    waitpid(pid_, nullptr, 0);
  }
  if (outPipe_ >= 0) close(outPipe_);
  if (errPipe_ >= 0) close(errPipe_);
}

bool LiveProcess::readSome(int timeoutMs) {
  pollfd fds[2] = {{outPipe_, POLLIN, 0}, {errPipe_, POLLIN, 0}};
  if (poll(fds, 2, timeoutMs) <= 0) return false;
  bool any = false;
  for (int i = 0; i < 2; ++i) {
    if (!(fds[i].revents & (POLLIN | POLLHUP | POLLERR))) continue;
    char buffer[8192];
    const ssize_t n = read(fds[i].fd, buffer, sizeof buffer);
    if (n > 0) {
      (i == 0 ? out_ : err_).append(buffer, static_cast<size_t>(n));
      any = true;
    } else {
      // End of this output: stop polling it.
      close(fds[i].fd);
      (i == 0 ? outPipe_ : errPipe_) = -1;
    }
  }
  return any || outPipe_ >= 0 || errPipe_ >= 0;
}

bool LiveProcess::waitForLine(const std::string& line, int seconds) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(seconds);
  for (;;) {
    if (("\n" + out_).find("\n" + line + "\n") != std::string::npos) return true;
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
        deadline - std::chrono::steady_clock::now());
    if (left.count() <= 0 || (outPipe_ < 0 && errPipe_ < 0)) return false;
    readSome(static_cast<int>(std::min<long long>(left.count(), 100)));
  }
}

void LiveProcess::signal(int number) {
  if (pid_ > 0) kill(pid_, number);
}

Outcome LiveProcess::finish() {
  Outcome outcome;
  if (pid_ > 0) {
    // Read both outputs to their end (a chatty child must never block on a full pipe), then
    // reap; a child that outlives its time limit is killed.
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(timeoutSeconds_);
    while ((outPipe_ >= 0 || errPipe_ >= 0) && std::chrono::steady_clock::now() < deadline)
      readSome(50);
    const auto left = std::chrono::duration_cast<std::chrono::seconds>(
        deadline - std::chrono::steady_clock::now());
    reap(pid_, std::max<int>(1, static_cast<int>(left.count())), outcome);
    pid_ = -1;
  }
  outcome.out = out_;
  outcome.err = err_;
  parseOutput(outcome);
  return outcome;
}

std::vector<std::string> underShim(std::vector<std::string> env) {
  env.push_back("LD_PRELOAD=" + programs().shim);
  env.push_back("DELTA_VERBOSE=1");
  return env;
}

TempDir::TempDir() {
  char path[] = "/tmp/delta-faults-dir-XXXXXX";
  if (mkdtemp(path) != nullptr) path_ = path;
}

TempDir::~TempDir() {
  if (path_.empty()) return;
  // Restore permissions a test may have taken away, then remove everything.
  std::string command = "chmod -R u+rwx '" + path_ + "' 2>/dev/null; rm -rf '" + path_ + "'";
  int ignored = std::system(command.c_str());
  (void)ignored;
}

std::string readFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

void writeFile(const std::string& path, const std::string& bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
}

bool fileExists(const std::string& path) {
  struct stat st {};
  return lstat(path.c_str(), &st) == 0;
}

std::vector<std::string> traceFiles(const std::string& dir) {
  std::vector<std::string> files;
  if (DIR* d = opendir(dir.c_str())) {
    while (dirent* entry = readdir(d)) {
      const std::string name = entry->d_name;
      if (name.size() > 6 && name.compare(name.size() - 6, 6, ".trace") == 0)
        files.push_back(dir + "/" + name);
    }
    closedir(d);
  }
  return files;
}

std::vector<std::string> faultJob(std::vector<std::string> extra) {
  std::vector<std::string> argv = {programs().faultJob, "--buffers", "10", "--mib", "4",
                                   "--rounds", "3"};
  argv.insert(argv.end(), extra.begin(), extra.end());
  return argv;
}

const Outcome& plainFaultJob() {
  static const Outcome outcome = run(faultJob());
  return outcome;
}

}  // namespace delta::faults
