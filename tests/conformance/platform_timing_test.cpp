/* GPU time on cudasim (driver/timing.h), each case in a fresh child process with its own
 * CUDASIM_*_GBPS: copies take their modeled time, the three engines overlap, one engine's
 * work does not, a pageable copy holds the host, events and queries follow the modeled clock,
 * and a host that falls behind is reported.
 *
 * Tolerances: a modeled duration is a deadline, so what a test measures around it is never
 * shorter (less 0.2 ms for the clock's reading); it may be longer by the host's own latency,
 * bounded here by half the modeled time plus 15 ms, generous for a loaded 2-core machine. */
#include <cudasim/cudasim.h>

#include <chrono>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "conformance_util.h"

namespace conformance {
namespace {

constexpr double kMs = 1e6;  // ns per ms

int64_t Now() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

// 0 when `measuredNs` is within the tolerance of `modeledNs`, else a failure naming `what`.
int Within(const char* what, int64_t measuredNs, int64_t modeledNs) {
  if (measuredNs + 200000 >= modeledNs && measuredNs <= modeledNs + modeledNs / 2 + 15 * kMs)
    return 0;
  std::fprintf(stderr, "%s: took %.3f ms, modeled %.3f ms\n", what, measuredNs / kMs,
               modeledNs / kMs);
  return 1;
}

void timed_kernel() {}
void TimedBody(void** params, dim3, dim3) {
  cudasimKernelTime(*static_cast<int64_t*>(params[0]));
  const int64_t hostNs = *static_cast<int64_t*>(params[1]);
  if (hostNs > 0) {  // host work slower than the device time it declares
    const int64_t until = Now() + hostNs;
    while (Now() < until) {
    }
  }
}

void RegisterTimedKernel() {
  static const size_t sizes[] = {8, 8};
  cudasimRegisterKernel(reinterpret_cast<const void*>(&timed_kernel), "timed_kernel", TimedBody, 2,
                        sizes);
}

cudaError_t LaunchTimed(int64_t deviceNs, cudaStream_t stream, int64_t hostNs = 0) {
  void* args[] = {&deviceNs, &hostNs};
  return cudaLaunchKernel(reinterpret_cast<const void*>(&timed_kernel), dim3(1), dim3(1), args, 0,
                          stream);
}

struct Buffers {
  void* device = nullptr;
  void* pinned = nullptr;
  explicit Buffers(size_t bytes) {
    cudaMalloc(&device, bytes);
    cudaMallocHost(&pinned, bytes);
  }
};

#define CHILD_RT(call)                                                        \
  do {                                                                        \
    if (cudaError_t e_ = (call); e_ != cudaSuccess) return ChildFail(#call, e_, 0); \
  } while (0)

// At 1 GB/s (1 byte/ns), 16 MiB each way: 16.8 ms, measured by events and by the host.
CONFORMANCE_CHILD(copy_time) {
  constexpr size_t kBytes = 16 << 20;
  Buffers b(kBytes);
  cudaStream_t s;
  CHILD_RT(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  cudaEvent_t start, end;
  CHILD_RT(cudaEventCreate(&start));
  CHILD_RT(cudaEventCreate(&end));
  for (cudaMemcpyKind kind : {cudaMemcpyHostToDevice, cudaMemcpyDeviceToHost}) {
    const bool toDevice = kind == cudaMemcpyHostToDevice;
    const int64_t t0 = Now();
    CHILD_RT(cudaEventRecord(start, s));
    CHILD_RT(cudaMemcpyAsync(toDevice ? b.device : b.pinned, toDevice ? b.pinned : b.device, kBytes,
                             kind, s));
    CHILD_RT(cudaEventRecord(end, s));
    // Asynchronous from pinned memory: the call returned long before the copy is done.
    if (Now() - t0 > 8 * kMs) return ChildFail("an async pinned copy held the host", 1, 0);
    if (cudaEventQuery(end) != cudaErrorNotReady) return ChildFail("event done too early", 1, 0);
    if (cudaStreamQuery(s) != cudaErrorNotReady) return ChildFail("stream done too early", 1, 0);
    CHILD_RT(cudaStreamSynchronize(s));
    const int64_t host = Now() - t0;
    float ms = 0;
    CHILD_RT(cudaEventElapsedTime(&ms, start, end));
    if (Within(toDevice ? "H2D by the host" : "D2H by the host", host, kBytes) ||
        Within(toDevice ? "H2D by events" : "D2H by events", static_cast<int64_t>(ms * kMs), kBytes))
      return 1;
  }
  // A device-to-device copy at CUDASIM_D2D_GBPS=2: 8.4 ms on the compute engine.
  void* other = nullptr;
  CHILD_RT(cudaMalloc(&other, kBytes));
  const int64_t t0 = Now();
  CHILD_RT(cudaMemcpyAsync(other, b.device, kBytes, cudaMemcpyDeviceToDevice, s));
  CHILD_RT(cudaStreamSynchronize(s));
  return Within("D2D", Now() - t0, kBytes / 2);
}

TEST(PlatformTiming, CopiesTakeTheirModeledTime) {
  ChildOptions opt;
  opt.set_env = {{"CUDASIM_H2D_GBPS", "1"}, {"CUDASIM_D2H_GBPS", "1.0"}, {"CUDASIM_D2D_GBPS", "2"}};
  ChildResult r = RunChild("copy_time", opt);
  EXPECT_TRUE(r.exited && r.exit_code == 0) << r.output;
}

// A host-to-device copy, a device-to-host copy and a kernel, 20 ms each on three streams: the
// three engines run at once (20 ms); two host-to-device copies on two streams take turns (40 ms).
CONFORMANCE_CHILD(engines) {
  RegisterTimedKernel();
  constexpr size_t kBytes = 20'000'000;  // 20 ms at 1 GB/s
  Buffers up(kBytes), down(kBytes);
  cudaStream_t s[3];
  for (cudaStream_t& stream : s) CHILD_RT(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  int64_t t0 = Now();
  CHILD_RT(cudaMemcpyAsync(up.device, up.pinned, kBytes, cudaMemcpyHostToDevice, s[0]));
  CHILD_RT(cudaMemcpyAsync(down.pinned, down.device, kBytes, cudaMemcpyDeviceToHost, s[1]));
  CHILD_RT(LaunchTimed(20 * kMs, s[2]));
  CHILD_RT(cudaDeviceSynchronize());
  if (Within("three engines at once", Now() - t0, 20 * kMs)) return 1;
  t0 = Now();
  CHILD_RT(cudaMemcpyAsync(up.device, up.pinned, kBytes, cudaMemcpyHostToDevice, s[0]));
  CHILD_RT(cudaMemcpyAsync(down.device, down.pinned, kBytes, cudaMemcpyHostToDevice, s[1]));
  CHILD_RT(cudaDeviceSynchronize());
  if (Within("two copies on one engine", Now() - t0, 40 * kMs)) return 1;
  // Two kernels on two streams share the compute engine too.
  t0 = Now();
  CHILD_RT(LaunchTimed(15 * kMs, s[0]));
  CHILD_RT(LaunchTimed(15 * kMs, s[1]));
  CHILD_RT(cudaDeviceSynchronize());
  return Within("two kernels", Now() - t0, 30 * kMs);
}

TEST(PlatformTiming, ThreeEnginesOverlapAndOneEngineTakesTurns) {
  ChildOptions opt;
  opt.set_env = {{"CUDASIM_H2D_GBPS", "1"}, {"CUDASIM_D2H_GBPS", "1"}};
  ChildResult r = RunChild("engines", opt);
  EXPECT_TRUE(r.exited && r.exit_code == 0) << r.output;
}

// From pageable memory, at half the bandwidth, and the call returns once the copy is done.
CONFORMANCE_CHILD(pageable) {
  constexpr size_t kBytes = 8'000'000;
  void* device = nullptr;
  CHILD_RT(cudaMalloc(&device, kBytes));
  std::vector<unsigned char> host(kBytes, 7);
  cudaStream_t s;
  CHILD_RT(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  for (cudaMemcpyKind kind : {cudaMemcpyHostToDevice, cudaMemcpyDeviceToHost}) {
    const int64_t t0 = Now();
    CHILD_RT(kind == cudaMemcpyHostToDevice
                 ? cudaMemcpyAsync(device, host.data(), kBytes, kind, s)
                 : cudaMemcpyAsync(host.data(), device, kBytes, kind, s));
    if (Within("the call of a pageable copy", Now() - t0, 2 * kBytes)) return 1;
    if (cudaStreamQuery(s) != cudaSuccess) return ChildFail("copy not done at return", 1, 0);
  }
  return 0;
}

TEST(PlatformTiming, APageableCopyHoldsTheHostAtHalfTheBandwidth) {
  ChildOptions opt;
  opt.set_env = {{"CUDASIM_H2D_GBPS", "1"}, {"CUDASIM_D2H_GBPS", "1"}};
  ChildResult r = RunChild("pageable", opt);
  EXPECT_TRUE(r.exited && r.exit_code == 0) << r.output;
}

// Kernel time, timed mode or not: events and queries follow it.
CONFORMANCE_CHILD(kernel_time) {
  RegisterTimedKernel();
  cudaStream_t s;
  CHILD_RT(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  cudaEvent_t start, end;
  CHILD_RT(cudaEventCreate(&start));
  CHILD_RT(cudaEventCreate(&end));
  const int64_t t0 = Now();
  CHILD_RT(cudaEventRecord(start, s));
  CHILD_RT(LaunchTimed(25 * kMs, s));
  CHILD_RT(cudaEventRecord(end, s));
  if (cudaEventQuery(end) != cudaErrorNotReady) return ChildFail("event done too early", 1, 0);
  CHILD_RT(cudaEventSynchronize(end));
  float ms = 0;
  CHILD_RT(cudaEventElapsedTime(&ms, start, end));
  if (Within("kernel by events", static_cast<int64_t>(ms * kMs), 25 * kMs) ||
      Within("kernel by the host", Now() - t0, 25 * kMs))
    return 1;
  // Untimed copies (no bandwidth set) take no modeled time: 64 MiB is far below 25 ms here.
  constexpr size_t kBytes = 64 << 20;
  Buffers b(kBytes);
  const int64_t t1 = Now();
  CHILD_RT(cudaMemcpy(b.device, b.pinned, kBytes, cudaMemcpyHostToDevice));
  if (Now() - t1 > 2000 * kMs) return ChildFail("an untimed copy took seconds", 1, 0);
  return 0;
}

TEST(PlatformTiming, KernelTimeWithoutBandwidthsAndEventsFollowIt) {
  ChildOptions opt;
  opt.unset_env = {"CUDASIM_H2D_GBPS", "CUDASIM_D2H_GBPS", "CUDASIM_D2D_GBPS"};
  ChildResult r = RunChild("kernel_time", opt);
  EXPECT_TRUE(r.exited && r.exit_code == 0) << r.output;
}

// A kernel whose body takes 30 ms on the host but declares 1 ms: the item ends with the host
// work, and CUDASIM_VERBOSE=1 says at exit that the run's times are not to be trusted.
CONFORMANCE_CHILD(overrun) {
  RegisterTimedKernel();
  CHILD_RT(LaunchTimed(1 * kMs, nullptr, 30 * kMs));
  CHILD_RT(cudaDeviceSynchronize());
  return 0;
}

TEST(PlatformTiming, AHostThatFallsBehindIsReportedAtExit) {
  ChildOptions opt;
  opt.set_env = {{"CUDASIM_VERBOSE", "1"}, {"CUDASIM_H2D_GBPS", "12"}};
  ChildResult r = RunChild("overrun", opt);
  EXPECT_TRUE(r.exited && r.exit_code == 0) << r.output;
  EXPECT_NE(r.output.find("took longer on the host than their modeled time"), std::string::npos)
      << r.output;
  EXPECT_NE(r.output.find("not to be trusted"), std::string::npos) << r.output;
}

CONFORMANCE_CHILD(bad_bandwidth) {
  cuInit(0);
  return 0;  // not reached: cuInit ends the process
}

TEST(PlatformTiming, ABadBandwidthStopsTheProcessWithOneLine) {
  for (const char* bad : {"fast", "-1", "1e9", "12GB"}) {
    ChildOptions opt;
    opt.set_env = {{"CUDASIM_H2D_GBPS", bad}};
    ChildResult r = RunChild("bad_bandwidth", opt);
    EXPECT_TRUE(r.exited && r.exit_code == 2) << bad << "\n" << r.output;
    EXPECT_NE(r.output.find("CUDASIM_H2D_GBPS='" + std::string(bad) + "' is not valid"),
              std::string::npos)
        << r.output;
  }
  ChildOptions zero;
  zero.set_env = {{"CUDASIM_D2D_GBPS", "0"}};
  ChildResult r = RunChild("bad_bandwidth", zero);
  EXPECT_TRUE(r.exited && r.exit_code == 2) << r.output;
}

}  // namespace
}  // namespace conformance
