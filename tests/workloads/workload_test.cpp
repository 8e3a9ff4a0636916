// Tests of the train-mlp workload as a program: it runs, its checksum depends only on its
// parameters, its measured peak follows --peak, deep models (--layers) keep every launch's
// working set small, replicas (--threads) are independent, and it fails cleanly (out of
// memory, bad arguments). Each case runs the binary, whose path meson passes as the first
// argument, with posix_spawn and parses its `key: value` output.
#include <gtest/gtest.h>
#include <poll.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <regex>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

extern char** environ;

namespace {

std::string g_binary;  // train-mlp

struct Outcome {
  int exit_code = -1;  // -1: killed by a signal
  int signal = 0;
  std::string out;
  std::string err;
  std::multimap<std::string, std::string> values;

  std::string value(const std::string& key) const {
    const auto it = values.find(key);
    return it == values.end() ? std::string() : it->second;
  }
  uint64_t number(const std::string& key) const {
    return std::strtoull(value(key).c_str(), nullptr, 10);
  }
  std::vector<std::string> all(const std::string& key) const {
    std::vector<std::string> result;
    for (auto [it, end] = values.equal_range(key); it != end; ++it) result.push_back(it->second);
    return result;
  }
  std::string describe() const { return "stdout:\n" + out + "stderr:\n" + err; }
};

// Runs train-mlp with `args`, the environment plus `env` (NAME=value, replacing NAME).
Outcome run(const std::vector<std::string>& args, const std::vector<std::string>& env = {}) {
  std::vector<std::string> environment;
  for (char** e = environ; *e != nullptr; ++e) {
    const std::string entry = *e;
    bool replaced = false;
    for (const auto& override_entry : env) {
      const auto name = override_entry.substr(0, override_entry.find('=') + 1);
      if (entry.compare(0, name.size(), name) == 0) replaced = true;
    }
    if (!replaced) environment.push_back(entry);
  }
  environment.insert(environment.end(), env.begin(), env.end());
  std::vector<char*> envp;
  for (auto& e : environment) envp.push_back(e.data());
  envp.push_back(nullptr);
  std::vector<std::string> argv_strings = {g_binary};
  argv_strings.insert(argv_strings.end(), args.begin(), args.end());
  std::vector<char*> argv;
  for (auto& a : argv_strings) argv.push_back(a.data());
  argv.push_back(nullptr);

  int out_pipe[2], err_pipe[2];
  EXPECT_EQ(pipe(out_pipe), 0);
  EXPECT_EQ(pipe(err_pipe), 0);
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_adddup2(&actions, out_pipe[1], 1);
  posix_spawn_file_actions_adddup2(&actions, err_pipe[1], 2);
  posix_spawn_file_actions_addclose(&actions, out_pipe[0]);
  posix_spawn_file_actions_addclose(&actions, err_pipe[0]);
  pid_t pid = 0;
  const int spawned =
      posix_spawn(&pid, g_binary.c_str(), &actions, nullptr, argv.data(), envp.data());
  posix_spawn_file_actions_destroy(&actions);
  close(out_pipe[1]);
  close(err_pipe[1]);
  Outcome result;
  if (spawned != 0) {
    ADD_FAILURE() << "posix_spawn " << g_binary << ": " << std::strerror(spawned);
    close(out_pipe[0]);
    close(err_pipe[0]);
    return result;
  }
  // Read both pipes until both close, so that neither can fill up and stall the child.
  pollfd fds[2] = {{out_pipe[0], POLLIN, 0}, {err_pipe[0], POLLIN, 0}};
  std::string* sinks[2] = {&result.out, &result.err};
  int open_fds = 2;
  while (open_fds > 0) {
    if (poll(fds, 2, -1) < 0) break;
    for (int i = 0; i < 2; ++i) {
      if (fds[i].fd < 0 || fds[i].revents == 0) continue;
      char buffer[4096];
      const ssize_t n = read(fds[i].fd, buffer, sizeof(buffer));
      if (n > 0) {
        sinks[i]->append(buffer, static_cast<size_t>(n));
      } else {
        close(fds[i].fd);
        fds[i].fd = -1;
        --open_fds;
      }
    }
  }
  int status = 0;
  waitpid(pid, &status, 0);
  if (WIFEXITED(status)) result.exit_code = WEXITSTATUS(status);
  if (WIFSIGNALED(status)) result.signal = WTERMSIG(status);
  std::istringstream lines(result.out);
  for (std::string line; std::getline(lines, line);) {
    const size_t colon = line.find(": ");
    if (colon != std::string::npos) {
      result.values.emplace(line.substr(0, colon), line.substr(colon + 2));
    }
  }
  return result;
}

constexpr const char* kDeviceMemory = "CUDASIM_DEVICE_MEMORY=1G";

TEST(TrainMlp, RunsAndPrintsChecksum) {
  const Outcome r = run({"--peak", "16M", "--iters", "3"}, {kDeviceMemory});
  ASSERT_EQ(r.exit_code, 0) << r.describe();
  EXPECT_TRUE(std::regex_match(r.value("checksum"), std::regex("0x[0-9a-f]{16}"))) << r.describe();
  const auto losses = r.all("loss");
  ASSERT_EQ(losses.size(), 3u) << r.describe();
  ASSERT_EQ(r.all("grad_norm").size(), 3u) << r.describe();
  for (const auto& loss : losses) EXPECT_TRUE(std::isfinite(std::stod(loss))) << r.describe();
  // It learns: the loss of the last iteration is below the first's.
  EXPECT_LT(std::stod(losses.back()), std::stod(losses.front())) << r.describe();
  EXPECT_EQ(r.err, "");
}

TEST(TrainMlp, SameParametersSameChecksum) {
  const std::vector<std::string> args = {"--peak", "24M", "--iters", "3", "--seed", "7"};
  const Outcome first = run(args, {kDeviceMemory});
  const Outcome second = run(args, {kDeviceMemory});
  ASSERT_EQ(first.exit_code, 0) << first.describe();
  ASSERT_EQ(second.exit_code, 0) << second.describe();
  EXPECT_EQ(first.value("checksum"), second.value("checksum"));
  EXPECT_EQ(first.all("loss"), second.all("loss"));
  EXPECT_EQ(first.all("grad_norm"), second.all("grad_norm"));
}

TEST(TrainMlp, DifferentSeedsDifferentChecksums) {
  const Outcome one = run({"--peak", "8M", "--iters", "2", "--seed", "1"}, {kDeviceMemory});
  const Outcome two = run({"--peak", "8M", "--iters", "2", "--seed", "2"}, {kDeviceMemory});
  ASSERT_EQ(one.exit_code, 0) << one.describe();
  ASSERT_EQ(two.exit_code, 0) << two.describe();
  EXPECT_NE(one.value("checksum"), two.value("checksum"));
  EXPECT_NE(one.all("loss"), two.all("loss"));
}

TEST(TrainMlp, MeasuredPeakFollowsRequest) {
  for (const uint64_t mib : {64, 256}) {
    SCOPED_TRACE(std::to_string(mib) + " MiB");
    const uint64_t requested = mib << 20;
    const Outcome r = run({"--peak", std::to_string(mib) + "M", "--iters", "1"}, {kDeviceMemory});
    ASSERT_EQ(r.exit_code, 0) << r.describe();
    EXPECT_EQ(r.number("peak_requested_bytes"), requested);
    const uint64_t measured = r.number("peak_live_bytes");
    EXPECT_LE(measured, requested);
    EXPECT_GE(measured, requested - requested * 15 / 100) << r.describe();
    EXPECT_EQ(measured, r.number("planned_peak_bytes"));
    // The device's own account, from cudaMemGetInfo, holds at least what the job allocated.
    EXPECT_GE(r.number("device_used_at_peak_bytes"), measured) << r.describe();
  }
}

TEST(TrainMlp, OutOfMemoryFailsCleanly) {
  const Outcome r = run({"--peak", "64M", "--iters", "1"}, {"CUDASIM_DEVICE_MEMORY=32M"});
  EXPECT_EQ(r.signal, 0) << r.describe();
  EXPECT_EQ(r.exit_code, 1) << r.describe();
  EXPECT_NE(r.err.find("cudaMalloc("), std::string::npos) << r.describe();
  EXPECT_NE(r.err.find("cudaErrorMemoryAllocation"), std::string::npos) << r.describe();
  // What the real cudaGetErrorString says for it.
  EXPECT_NE(r.err.find("out of memory"), std::string::npos) << r.describe();
  EXPECT_EQ(r.value("checksum"), "");
}

// Deep models: the same parameters give the same bytes, --layers 2 is the default model, the
// measured peak still follows --peak, and no launch touches more than a quarter of the peak
// (what the shim's end-to-end tests rely on to run every launch within a budget of peak / 2).
TEST(TrainMlp, LayersDeterministicAndSmallWorkingSet) {
  for (const char* layers : {"8", "16"}) {
    SCOPED_TRACE(std::string("--layers ") + layers);
    const std::vector<std::string> args = {"--peak", "32M", "--iters", "2", "--layers", layers};
    const Outcome first = run(args, {kDeviceMemory});
    const Outcome second = run(args, {kDeviceMemory});
    ASSERT_EQ(first.exit_code, 0) << first.describe();
    ASSERT_EQ(second.exit_code, 0) << second.describe();
    EXPECT_EQ(first.value("hidden_layers"), layers);
    EXPECT_TRUE(std::regex_match(first.value("checksum"), std::regex("0x[0-9a-f]{16}")))
        << first.describe();
    EXPECT_EQ(first.value("checksum"), second.value("checksum"));
    EXPECT_EQ(first.all("loss"), second.all("loss"));
    const uint64_t requested = 32ull << 20;
    const uint64_t measured = first.number("peak_live_bytes");
    EXPECT_EQ(measured, first.number("planned_peak_bytes"));
    EXPECT_LE(measured, requested);
    EXPECT_GE(measured, requested - requested * 15 / 100) << first.describe();
    const uint64_t working_set = first.number("max_launch_working_set_bytes");
    EXPECT_GT(working_set, 0u) << first.describe();
    EXPECT_LE(working_set, measured / 4) << first.describe();
    EXPECT_EQ(working_set, second.number("max_launch_working_set_bytes"));
  }
  const Outcome plain = run({"--peak", "8M", "--iters", "2"}, {kDeviceMemory});
  const Outcome two = run({"--peak", "8M", "--iters", "2", "--layers", "2"}, {kDeviceMemory});
  ASSERT_EQ(plain.exit_code, 0) << plain.describe();
  ASSERT_EQ(two.exit_code, 0) << two.describe();
  EXPECT_EQ(plain.value("layers"), "8-16-16-1");
  EXPECT_EQ(plain.value("checksum"), two.value("checksum"));
}

// Replica i of a --threads T job with seed S and peak P is the one-thread job with seed S + i
// and peak P / T, whatever the other replicas do at the same time; the overall checksum
// covers the replicas in thread order and is as deterministic as each of them.
TEST(TrainMlp, ThreadsAreIndependentReplicas) {
  const std::vector<std::string> args = {"--peak", "32M", "--iters", "2", "--layers", "8",
                                         "--seed", "5", "--threads", "2"};
  const Outcome first = run(args, {kDeviceMemory});
  const Outcome second = run(args, {kDeviceMemory});
  ASSERT_EQ(first.exit_code, 0) << first.describe();
  ASSERT_EQ(second.exit_code, 0) << second.describe();
  EXPECT_EQ(first.err, "");
  EXPECT_EQ(first.value("threads"), "2");
  for (const char* key : {"checksum", "checksum_thread_0", "checksum_thread_1"}) {
    EXPECT_TRUE(std::regex_match(first.value(key), std::regex("0x[0-9a-f]{16}")))
        << key << "\n" << first.describe();
    EXPECT_EQ(first.value(key), second.value(key)) << key;
  }
  for (const char* key : {"loss_thread_0", "loss_thread_1"}) {
    EXPECT_EQ(first.all(key).size(), 2u) << key << "\n" << first.describe();
    EXPECT_EQ(first.all(key), second.all(key)) << key;
  }
  EXPECT_NE(first.value("checksum_thread_0"), first.value("checksum_thread_1"));
  EXPECT_NE(first.value("checksum"), first.value("checksum_thread_0"));
  EXPECT_LE(first.number("peak_live_bytes"), 32ull << 20);
  EXPECT_LE(first.number("max_launch_working_set_bytes"), first.number("peak_live_bytes") / 4);

  for (const int thread : {0, 1}) {
    SCOPED_TRACE("thread " + std::to_string(thread));
    const Outcome alone = run({"--peak", "16M", "--iters", "2", "--layers", "8", "--seed",
                               std::to_string(5 + thread)},
                              {kDeviceMemory});
    ASSERT_EQ(alone.exit_code, 0) << alone.describe();
    EXPECT_EQ(alone.value("rows"), first.value("rows"));
    EXPECT_EQ(alone.value("checksum"), first.value("checksum_thread_" + std::to_string(thread)));
    EXPECT_EQ(alone.all("loss"), first.all("loss_thread_" + std::to_string(thread)));
  }
}

TEST(TrainMlp, BadArgumentsExitTwo) {
  const std::vector<std::vector<std::string>> cases = {
      {"--peak", "12X"},     {"--peak", "0"},        {"--peak"},
      {"--peak", "1K"},      {"--iters", "0"},       {"--iters", "x"},
      {"--seed", "-1"},      {"--bogus"},            {"extra"},
      {"--peak=-5M"},        {"--layers", "0"},      {"--layers", "65"},
      {"--layers", "x"},     {"--layers="},          {"--layers"},
      {"--threads", "0"},    {"--threads", "17"},    {"--threads", "-2"},
      {"--threads"},         {"--threads", "1M"},
      // A peak the one-thread job fits in, but not 16 replicas sharing it.
      {"--peak", "1M", "--threads", "16"},
  };
  for (const auto& args : cases) {
    std::string command_line;
    for (const auto& arg : args) command_line += " " + arg;
    SCOPED_TRACE(command_line);
    const Outcome r = run(args);
    EXPECT_EQ(r.exit_code, 2) << r.describe();
    EXPECT_EQ(r.out, "");
    // One line, naming the problem.
    EXPECT_NE(r.err.find("bad argument"), std::string::npos) << r.describe();
    EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 1) << r.describe();
  }
  const Outcome help = run({"--help"});
  EXPECT_EQ(help.exit_code, 0);
  EXPECT_NE(help.out.find("usage: train-mlp"), std::string::npos) << help.describe();
}

}  // namespace

int main(int argc, char** argv) {
  testing::InitGoogleTest(&argc, argv);
  if (argc != 2) {
    std::fprintf(stderr, "usage: %s [gtest options] PATH-TO-train-mlp\n", argv[0]);
    return 2;
  }
  g_binary = argv[1];
  return RUN_ALL_TESTS();
}
