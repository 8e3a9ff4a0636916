/* Helpers shared by the conformance tests: status assertions that print the error's name,
 * a gate that host functions block on (so races are made deterministic without sleeps),
 * a driver-API fixture with the primary context current, and "child modes": small
 * functions the test binary runs in a fresh process (fork + exec of itself), for tests that
 * need an untouched CUDA state, a second process (IPC), or a different environment.
 *
 * Portable: uses only the real CUDA API, so the portable tests built on it run unchanged
 * against a real driver. */
#ifndef DELTA_TESTS_CONFORMANCE_UTIL_H
#define DELTA_TESTS_CONFORMANCE_UTIL_H

#include <cuda.h>
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <map>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

namespace conformance {

// Every wait on something that should happen: long enough for a loaded 2-core machine,
// short enough that a hang fails the test instead of the suite's timeout.
inline constexpr std::chrono::milliseconds kPositiveWait{10000};
// A wait used to check that something does NOT happen while work it depends on is blocked.
// A wrong platform shows up quickly; a right one costs this much per check.
inline constexpr std::chrono::milliseconds kNegativeWait{300};

std::string CuName(CUresult r);
std::string RtName(cudaError_t r);

}  // namespace conformance

namespace conformance {
::testing::AssertionResult CuEq(const char* expected_expr, const char* call_expr,
                                CUresult expected, CUresult got);
::testing::AssertionResult RtEq(const char* expected_expr, const char* call_expr,
                                cudaError_t expected, cudaError_t got);
}  // namespace conformance

// Status assertions; like every gtest assertion they accept `<< "more context"`.
#define ASSERT_CU_EQ(expected, call) ASSERT_PRED_FORMAT2(::conformance::CuEq, expected, call)
#define EXPECT_CU_EQ(expected, call) EXPECT_PRED_FORMAT2(::conformance::CuEq, expected, call)
#define ASSERT_CU(call) ASSERT_CU_EQ(CUDA_SUCCESS, call)
#define EXPECT_CU(call) EXPECT_CU_EQ(CUDA_SUCCESS, call)
#define ASSERT_RT_EQ(expected, call) ASSERT_PRED_FORMAT2(::conformance::RtEq, expected, call)
#define EXPECT_RT_EQ(expected, call) EXPECT_PRED_FORMAT2(::conformance::RtEq, expected, call)
#define ASSERT_RT(call) ASSERT_RT_EQ(cudaSuccess, call)
#define EXPECT_RT(call) EXPECT_RT_EQ(cudaSuccess, call)

namespace conformance {

// A one-shot gate: host functions wait on it; the test opens it. Waits are bounded; a wait
// that times out is remembered so the test can fail instead of hanging.
class Gate {
 public:
  void Open();
  // Waits up to `limit`; true if the gate opened.
  bool Wait(std::chrono::milliseconds limit = kPositiveWait);
  bool timed_out() const { return timed_out_.load(); }

  // For cuLaunchHostFunc/cudaLaunchHostFunc: blocks the stream until Open().
  static void CUDA_CB BlockHostFn(void* gate);

 private:
  std::mutex mutex_;
  std::condition_variable cv_;
  bool open_ = false;
  std::atomic<bool> timed_out_{false};
};

// A gate the device waits on: Hold(s) enqueues cuStreamWaitValue32 on a word of pinned host
// memory, and Open() sets the word. The stream holds, and nothing else does. A host function
// blocked on a Gate is not that on a real driver: it runs every stream's host functions on one
// thread (its documentation allows it; an H200 with driver 580 did), so a Gate on one stream
// also holds every other stream's host functions, and tests that watch another stream progress
// past a held one need this gate.
class StreamGate {
 public:
  StreamGate() = default;
  ~StreamGate() { Close(); }
  StreamGate(const StreamGate&) = delete;
  StreamGate& operator=(const StreamGate&) = delete;
  CUresult Hold(CUstream stream);
  void Open();
  // Opens the gate, waits for the context's streams, frees the word: call it while the context
  // is still current (a fixture's TearDown, before the context goes).
  void Close();

 private:
  uint32_t* word_ = nullptr;
  CUdeviceptr device_ = 0;
};

// Records the order in which host functions ran; WaitFor waits (bounded) for a mark.
class OrderLog {
 public:
  void Mark(const std::string& what);
  bool WaitFor(const std::string& what, std::chrono::milliseconds limit);
  bool Has(const std::string& what);
  std::vector<std::string> Marks();

 private:
  std::mutex mutex_;
  std::condition_variable cv_;
  std::vector<std::string> marks_;
};

// A host function that marks `what` in `log` when it runs. Owns its strings; keep it alive
// until the stream has drained.
struct Marker {
  OrderLog* log;
  std::string what;
  static void CUDA_CB HostFn(void* marker);
};

// A host function that first waits for `gate`, then marks `what`.
struct GatedMarker {
  Gate* gate;
  OrderLog* log;
  std::string what;
  static void CUDA_CB HostFn(void* marker);
};

// Driver fixture: cuInit, device 0, primary context retained and current.
class DriverTest : public ::testing::Test {
 protected:
  void SetUp() override;
  void TearDown() override;
  CUdevice dev_ = 0;
  CUcontext ctx_ = nullptr;
};

// Pinned host buffer (cuMemHostAlloc); freed on destruction.
class PinnedBuffer {
 public:
  explicit PinnedBuffer(size_t bytes);
  ~PinnedBuffer();
  PinnedBuffer(const PinnedBuffer&) = delete;
  PinnedBuffer& operator=(const PinnedBuffer&) = delete;
  unsigned char* data() const { return static_cast<unsigned char*>(p_); }
  bool ok() const { return p_ != nullptr; }

 private:
  void* p_ = nullptr;
};

// ---- child processes ----
// A child mode is a function run in a fresh process: `binary --conformance-child NAME ARGS...`.
// It returns the process exit code (0 = pass) and explains failures on stderr.
using ChildFn = int (*)(const std::vector<std::string>& args);
bool RegisterChild(const char* name, ChildFn fn);

#define CONFORMANCE_CHILD(name)                                                           \
  static int conformance_child_##name(const std::vector<std::string>& args);              \
  [[maybe_unused]] static const bool conformance_child_registered_##name =                 \
      ::conformance::RegisterChild(#name, conformance_child_##name);                       \
  static int conformance_child_##name([[maybe_unused]] const std::vector<std::string>& args)

struct ChildResult {
  bool exited = false;  // exited normally (else killed by a signal or timed out)
  int exit_code = -1;
  int signal = 0;
  bool timed_out = false;
  std::string output;  // stdout and stderr together
};

struct ChildOptions {
  std::vector<std::string> args;
  std::vector<std::pair<std::string, std::string>> set_env;  // added/overridden
  std::vector<std::string> unset_env;
  std::vector<int> keep_fds;  // fds the child inherits (close-on-exec cleared)
  std::chrono::milliseconds limit{30000};
  std::string executable;  // default: this test binary
};

// Forks and execs the test binary in child mode `name`; waits (bounded) and collects output.
ChildResult RunChild(const std::string& name, const ChildOptions& options = {});

// Path of the running test binary.
std::string SelfExe();

// Helpers for child modes: print and fail.
int ChildFail(const char* what, long long got, long long expected);

}  // namespace conformance

#endif  // DELTA_TESTS_CONFORMANCE_UTIL_H
