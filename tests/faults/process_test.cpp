// Processes and signals under libdelta.so: fork with and without exec, SIGINT/SIGTERM while
// buffers are being evicted, and a program that never frees. The trace must stay the
// parent's alone and readable by `delta-trace summary`, with the counts the shim reported.
#include <chrono>
#include <csignal>
#include <memory>
#include <regex>
#include <string>
#include <thread>
#include <vector>

#include "faults_util.h"

namespace delta::faults {
namespace {

size_t occurrences(const std::string& text, const std::string& what) {
  size_t count = 0;
  for (size_t at = text.find(what); at != std::string::npos; at = text.find(what, at + 1)) ++count;
  return count;
}

// `delta-trace summary` of `path`: it must read, and say the job's evictions and restores.
struct TraceSummary {
  Outcome tool;
  long long evictions = -1;
  long long restores = -1;
  long long pid = -1;
  bool closed = false;  // no warning about a missing closing record or a cut-short file
};

TraceSummary summarize(const std::string& path) {
  TraceSummary s;
  RunOptions options;
  options.timeoutSeconds = 30;
  s.tool = run({programs().deltaTrace, "summary", path}, options);
  std::smatch m;
  if (std::regex_search(s.tool.out, m, std::regex(R"(in (\d+) eviction\(s\))")))
    s.evictions = std::stoll(m[1]);
  if (std::regex_search(s.tool.out, m, std::regex(R"(in (\d+) restore\(s\))")))
    s.restores = std::stoll(m[1]);
  if (std::regex_search(s.tool.out, m, std::regex(R"(pid (\d+))"))) s.pid = std::stoll(m[1]);
  s.closed = s.tool.status == 0 && (s.tool.out + s.tool.err).find("warning") == std::string::npos;
  return s;
}

void expectIntact(const Outcome& shimmed) {
  ASSERT_EQ(plainFaultJob().status, 0) << plainFaultJob().describe();
  EXPECT_EQ(shimmed.status, 0) << shimmed.describe();
  EXPECT_EQ(shimmed.err.find("cudasim: illegal address"), std::string::npos) << shimmed.describe();
  EXPECT_EQ(shimmed.value("checksum"), plainFaultJob().value("checksum")) << shimmed.describe();
}

TEST(Processes, ForkWithoutExecChildInheritsNothing) {
  // The child of a CUDA process cannot use CUDA: it must get the runtime's own error, as
  // without the shim, and leave the parent's residency state and trace alone.
  const std::vector<std::string> extra = {"--fork", "plain", "--fork-after-round", "1"};
  const Outcome plain = run(faultJob(extra));
  ASSERT_EQ(plain.status, 0) << plain.describe();
  TempDir dir;
  const Outcome shimmed =
      run(faultJob(extra), {underShim({"DELTA_BUDGET=16M", "DELTA_TRACE=" + dir.file("job.trace")})});
  expectIntact(shimmed);
  EXPECT_EQ(shimmed.value("child_malloc"), plain.value("child_malloc")) << shimmed.describe();
  EXPECT_EQ(shimmed.value("child"), "0") << shimmed.describe();
  EXPECT_EQ(occurrences(shimmed.err, "libdelta: stats"), 1u) << "the child reports nothing\n"
                                                             << shimmed.describe();
  EXPECT_TRUE(shimmed.shimMessages().empty()) << shimmed.describe();
  ASSERT_EQ(traceFiles(dir.path()).size(), 1u);
  const TraceSummary trace = summarize(dir.file("job.trace"));
  EXPECT_TRUE(trace.closed) << trace.tool.describe();
  EXPECT_EQ(trace.evictions, static_cast<long long>(shimmed.stat("evictions")))
      << trace.tool.describe();
  EXPECT_EQ(trace.restores, static_cast<long long>(shimmed.stat("restores")))
      << trace.tool.describe();
}

TEST(Processes, ForkAndExecAnotherCudaProcessKeepsTheParentsTrace) {
  // The exec'd child is a fresh CUDA process under the shim with the same environment: the
  // same DELTA_TRACE. It must not truncate or write into the file the parent is writing.
  const std::vector<std::string> extra = {"--fork", "exec", "--fork-after-round", "1"};
  TempDir dir;
  const std::string path = dir.file("job.trace");
  const Outcome shimmed = run(faultJob(extra), {underShim({"DELTA_BUDGET=16M", "DELTA_TRACE=" + path})});
  expectIntact(shimmed);
  EXPECT_EQ(shimmed.value("probe"), "ok") << shimmed.describe();
  EXPECT_EQ(shimmed.value("child"), "0") << shimmed.describe();
  const TraceSummary trace = summarize(path);
  EXPECT_TRUE(trace.closed) << trace.tool.describe();
  EXPECT_EQ(trace.evictions, static_cast<long long>(shimmed.stat("evictions")))
      << "the parent's trace, whole\n" << trace.tool.describe() << shimmed.describe();
  // The child said, once, why it records nothing.
  ASSERT_EQ(shimmed.shimMessages().size(), 1u) << shimmed.describe();
  EXPECT_NE(shimmed.shimMessages()[0].find("DELTA_TRACE"), std::string::npos)
      << shimmed.describe();
  // With %p each process has its own trace, both readable.
  TempDir perProcess;
  const Outcome separate = run(
      faultJob(extra),
      {underShim({"DELTA_BUDGET=16M", "DELTA_TRACE=" + perProcess.file("job-%p.trace")})});
  expectIntact(separate);
  EXPECT_TRUE(separate.shimMessages().empty()) << separate.describe();
  const std::vector<std::string> files = traceFiles(perProcess.path());
  ASSERT_EQ(files.size(), 2u) << separate.describe();
  for (const std::string& file : files) EXPECT_TRUE(summarize(file).closed) << file;
}

// Starts a long job with slow copies, so that evictions are in progress most of the time,
// and returns once it has finished its first round.
std::unique_ptr<LiveProcess> startEvicting(const std::string& tracePath,
                                           std::vector<std::string> extra) {
  std::vector<std::string> argv = faultJob({"--rounds", "1000"});
  argv.insert(argv.end(), extra.begin(), extra.end());
  RunOptions options;
  options.env = underShim({"DELTA_BUDGET=16M", "DELTA_TRACE=" + tracePath,
                           "CUDASIM_FAULTS=slow-copy-us=5000"});
  options.timeoutSeconds = 60;
  auto process = std::make_unique<LiveProcess>(argv, options);
  EXPECT_TRUE(process->waitForLine("round: 0", 60)) << "the job did not get going";
  // Inside the next round's evictions (each copy takes 5 ms).
  std::this_thread::sleep_for(std::chrono::milliseconds(120));
  return process;
}

TEST(Processes, SigtermDuringEvictionLeavesAReadableTrace) {
  // Default action: the process ends at once; no atexit handler, no closing record.
  TempDir dir;
  auto process = startEvicting(dir.file("job.trace"), {});
  process->signal(SIGTERM);
  const Outcome killed = process->finish();
  EXPECT_EQ(killed.signal, SIGTERM) << killed.describe();
  EXPECT_EQ(killed.err.find("cudasim: illegal address"), std::string::npos) << killed.describe();
  const TraceSummary trace = summarize(dir.file("job.trace"));
  EXPECT_EQ(trace.tool.status, 0) << "readable, with a warning\n" << trace.tool.describe();
  EXPECT_EQ(trace.tool.signal, 0);
  EXPECT_GE(trace.evictions, 0) << trace.tool.describe();
}

TEST(Processes, SigintHandledByTheProgramClosesTheTrace) {
  // The program's handler sets a flag; the program then ends normally (as Python does on
  // KeyboardInterrupt): the shim's exit handler closes the trace with the final counts.
  TempDir dir;
  auto process = startEvicting(dir.file("job.trace"), {"--on-signal", "flag"});
  process->signal(SIGINT);
  const Outcome ended = process->finish();
  EXPECT_EQ(ended.status, 130) << ended.describe();
  EXPECT_NE(ended.out.find("interrupted"), std::string::npos) << ended.describe();
  const TraceSummary trace = summarize(dir.file("job.trace"));
  EXPECT_TRUE(trace.closed) << trace.tool.describe();
  EXPECT_EQ(trace.evictions, static_cast<long long>(ended.stat("evictions")))
      << trace.tool.describe() << ended.describe();
  EXPECT_GT(trace.evictions, 0) << trace.tool.describe();
}

TEST(Processes, ExitFromASignalHandlerDuringEvictionDoesNotHang) {
  // exit() from the handler runs the shim's exit handler on top of whatever the interrupted
  // thread was doing, possibly inside the shim's own eviction. It must end, and the trace
  // must read (closed, or cut short with a warning).
  for (int signal : {SIGTERM, SIGINT}) {
    SCOPED_TRACE(signal);
    TempDir dir;
    auto process = startEvicting(dir.file("job.trace"), {"--on-signal", "exit"});
    process->signal(signal);
    const Outcome ended = process->finish();
    EXPECT_EQ(ended.status, 130) << ended.describe();
    const TraceSummary trace = summarize(dir.file("job.trace"));
    EXPECT_EQ(trace.tool.status, 0) << trace.tool.describe();
  }
}

TEST(Processes, ProgramThatNeverFreesExitsCleanlyWithAClosedTrace) {
  TempDir dir;
  const Outcome shimmed = run(faultJob({"--no-free"}), {underShim({"DELTA_BUDGET=16M",
                                                                   "DELTA_TRACE=" + dir.file("job.trace")})});
  expectIntact(shimmed);
  EXPECT_TRUE(shimmed.shimMessages().empty()) << shimmed.describe();
  const TraceSummary trace = summarize(dir.file("job.trace"));
  EXPECT_TRUE(trace.closed) << trace.tool.describe();
  EXPECT_EQ(trace.evictions, static_cast<long long>(shimmed.stat("evictions")))
      << trace.tool.describe();
}

}  // namespace
}  // namespace delta::faults
