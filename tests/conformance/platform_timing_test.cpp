/* GPU time on cudasim (driver/timing.h), each case in a fresh child process with its own
 * CUDASIM_*_GBPS: copies take their modeled time, the three engines overlap, one engine's
 * work does not, a pageable copy holds the host, events and queries follow the modeled clock,
 * and a host that falls behind is reported.
 *
 * Nothing here passes or fails on how fast this machine is. Each case holds its streams behind
 * a gate (a kernel that waits for the host) until all its work is queued, so that every item
 * becomes ready at the same modeled instant; the events then read exactly the model's
 * arithmetic, as long as the host kept up (cudasimTimingOverruns() is 0; when it did not, only
 * the lower bounds are checked, and the child says so). What the host measures around the
 * work is checked only from below: a modeled duration is a deadline the platform sleeps to. */
#include <cudasim/cudasim.h>

#include <atomic>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>
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

// 0 when the host measured at least the modeled time (less 0.2 ms for reading the clock).
int AtLeast(const char* what, int64_t measuredNs, int64_t modeledNs) {
  if (measuredNs + 200000 >= modeledNs) return 0;
  std::fprintf(stderr, "%s: took %.3f ms, less than the modeled %.3f ms\n", what,
               measuredNs / kMs, modeledNs / kMs);
  return 1;
}

// 0 when the events `from` and `to` are `modeledNs` apart: exactly (to the 2 us an elapsed time
// in float milliseconds keeps) while the host kept up, at least that long otherwise.
int Exactly(const char* what, cudaEvent_t from, cudaEvent_t to, int64_t modeledNs) {
  float ms = 0;
  if (cudaEventElapsedTime(&ms, from, to) != cudaSuccess) {
    std::fprintf(stderr, "%s: no elapsed time between the events\n", what);
    return 1;
  }
  const int64_t elapsedNs = static_cast<int64_t>(static_cast<double>(ms) * kMs);
  const bool hostKeptUp = cudasimTimingOverruns() == 0;
  const int64_t slack = 2000;
  if (elapsedNs + slack >= modeledNs && (!hostKeptUp || elapsedNs <= modeledNs + slack)) {
    if (!hostKeptUp)
      std::fprintf(stderr, "%s: the host fell behind the model; only the lower bound checked\n",
                   what);
    return 0;
  }
  std::fprintf(stderr, "%s: events %.6f ms apart, modeled %.6f ms\n", what, elapsedNs / kMs,
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

// The gate: a kernel that declares no device time and returns once the host opens its
// generation. It ends when it returns, on the modeled clock as on the host's.
std::atomic<uint64_t> gOpenedGeneration{0};
void gate_kernel() {}
void GateBody(void** params, dim3, dim3) {
  const uint64_t generation = *static_cast<uint64_t*>(params[0]);
  while (gOpenedGeneration.load() < generation) std::this_thread::yield();
}

void RegisterKernels() {
  static const size_t timedSizes[] = {8, 8};
  cudasimRegisterKernel(reinterpret_cast<const void*>(&timed_kernel), "timed_kernel", TimedBody, 2,
                        timedSizes);
  static const size_t gateSizes[] = {8};
  cudasimRegisterKernel(reinterpret_cast<const void*>(&gate_kernel), "gate_kernel", GateBody, 1,
                        gateSizes);
}

cudaError_t LaunchTimed(int64_t deviceNs, cudaStream_t stream, int64_t hostNs = 0) {
  void* args[] = {&deviceNs, &hostNs};
  return cudaLaunchKernel(reinterpret_cast<const void*>(&timed_kernel), dim3(1), dim3(1), args, 0,
                          stream);
}

// Holds streams until Open(): `opened` fires at the instant they may all start.
class Gate {
 public:
  cudaError_t Close() {
    cudaError_t e = stream_ ? cudaSuccess : cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking);
    if (e == cudaSuccess && !opened) e = cudaEventCreate(&opened);
    uint64_t generation = ++generation_;
    void* args[] = {&generation};
    if (e == cudaSuccess)
      e = cudaLaunchKernel(reinterpret_cast<const void*>(&gate_kernel), dim3(1), dim3(1), args, 0,
                           stream_);
    return e == cudaSuccess ? cudaEventRecord(opened, stream_) : e;
  }
  cudaError_t Hold(cudaStream_t stream) const { return cudaStreamWaitEvent(stream, opened, 0); }
  // Opens the gate; returns the host's time just before, which the work cannot start ahead of.
  int64_t Open() const {
    const int64_t now = Now();
    gOpenedGeneration.store(generation_);
    return now;
  }
  cudaEvent_t opened = nullptr;

 private:
  cudaStream_t stream_ = nullptr;
  uint64_t generation_ = 0;
};

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

// At 1 GB/s (1 byte/ns), 16 MiB each way: 16.78 ms by events, at least that by the host. The
// copy is queued behind a closed gate: an asynchronous copy from pinned memory returns at once
// (a call that waited for the copy would never return), and nothing is done before the gate opens.
CONFORMANCE_CHILD(copy_time) {
  RegisterKernels();
  constexpr size_t kBytes = 16 << 20;
  Buffers b(kBytes);
  cudaStream_t s;
  CHILD_RT(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  cudaEvent_t end;
  CHILD_RT(cudaEventCreate(&end));
  Gate gate;
  for (cudaMemcpyKind kind : {cudaMemcpyHostToDevice, cudaMemcpyDeviceToHost}) {
    const bool toDevice = kind == cudaMemcpyHostToDevice;
    CHILD_RT(gate.Close());
    CHILD_RT(gate.Hold(s));
    CHILD_RT(cudaMemcpyAsync(toDevice ? b.device : b.pinned, toDevice ? b.pinned : b.device, kBytes,
                             kind, s));
    CHILD_RT(cudaEventRecord(end, s));
    if (cudaEventQuery(end) != cudaErrorNotReady) return ChildFail("event done too early", 1, 0);
    if (cudaStreamQuery(s) != cudaErrorNotReady) return ChildFail("stream done too early", 1, 0);
    const int64_t t0 = gate.Open();
    CHILD_RT(cudaStreamSynchronize(s));
    if (AtLeast(toDevice ? "H2D by the host" : "D2H by the host", Now() - t0, kBytes) ||
        Exactly(toDevice ? "H2D by events" : "D2H by events", gate.opened, end, kBytes))
      return 1;
  }
  // A device-to-device copy at CUDASIM_D2D_GBPS=2: 8.4 ms on the compute engine.
  void* other = nullptr;
  CHILD_RT(cudaMalloc(&other, kBytes));
  CHILD_RT(gate.Close());
  CHILD_RT(gate.Hold(s));
  CHILD_RT(cudaMemcpyAsync(other, b.device, kBytes, cudaMemcpyDeviceToDevice, s));
  CHILD_RT(cudaEventRecord(end, s));
  const int64_t t0 = gate.Open();
  CHILD_RT(cudaStreamSynchronize(s));
  return AtLeast("D2D by the host", Now() - t0, kBytes / 2) ||
         Exactly("D2D by events", gate.opened, end, kBytes / 2);
}

TEST(PlatformTiming, CopiesTakeTheirModeledTime) {
  ChildOptions opt;
  opt.set_env = {{"CUDASIM_H2D_GBPS", "1"}, {"CUDASIM_D2H_GBPS", "1.0"}, {"CUDASIM_D2D_GBPS", "2"}};
  ChildResult r = RunChild("copy_time", opt);
  EXPECT_TRUE(r.exited && r.exit_code == 0) << r.output;
}

// A host-to-device copy, a device-to-host copy and a kernel, 20 ms each on three streams: the
// three engines run at once (each done 20 ms after the gate); two host-to-device copies on two
// streams take turns (20 and 40 ms), and so do two kernels (15 and 30 ms).
CONFORMANCE_CHILD(engines) {
  RegisterKernels();
  constexpr size_t kBytes = 20'000'000;  // 20 ms at 1 GB/s
  Buffers up(kBytes), down(kBytes);
  cudaStream_t s[3];
  cudaEvent_t end[3];
  for (int i = 0; i < 3; ++i) {
    CHILD_RT(cudaStreamCreateWithFlags(&s[i], cudaStreamNonBlocking));
    CHILD_RT(cudaEventCreate(&end[i]));
  }
  Gate gate;
  auto closeOn = [&](int streams) {
    cudaError_t e = gate.Close();
    for (int i = 0; i < streams && e == cudaSuccess; ++i) e = gate.Hold(s[i]);
    return e;
  };
  auto endEach = [&](int streams) {
    cudaError_t e = cudaSuccess;
    for (int i = 0; i < streams && e == cudaSuccess; ++i) e = cudaEventRecord(end[i], s[i]);
    return e;
  };

  CHILD_RT(closeOn(3));
  CHILD_RT(cudaMemcpyAsync(up.device, up.pinned, kBytes, cudaMemcpyHostToDevice, s[0]));
  CHILD_RT(cudaMemcpyAsync(down.pinned, down.device, kBytes, cudaMemcpyDeviceToHost, s[1]));
  CHILD_RT(LaunchTimed(20 * kMs, s[2]));
  CHILD_RT(endEach(3));
  int64_t t0 = gate.Open();
  CHILD_RT(cudaDeviceSynchronize());
  if (AtLeast("three engines at once, by the host", Now() - t0, 20 * kMs) ||
      Exactly("three engines at once: the H2D copy", gate.opened, end[0], 20 * kMs) ||
      Exactly("three engines at once: the D2H copy", gate.opened, end[1], 20 * kMs) ||
      Exactly("three engines at once: the kernel", gate.opened, end[2], 20 * kMs))
    return 1;

  // One engine, two streams: whichever goes first ends at 20 ms, the other at 40 ms.
  auto inTurn = [&](const char* what, int64_t eachNs) -> int {
    float first = 0, second = 0;
    if (cudaEventElapsedTime(&first, gate.opened, end[0]) != cudaSuccess ||
        cudaEventElapsedTime(&second, gate.opened, end[1]) != cudaSuccess)
      return ChildFail(what, 1, 0);
    const bool zeroFirst = first <= second;
    return Exactly(what, gate.opened, end[zeroFirst ? 0 : 1], eachNs) ||
           Exactly(what, gate.opened, end[zeroFirst ? 1 : 0], 2 * eachNs);
  };
  CHILD_RT(closeOn(2));
  CHILD_RT(cudaMemcpyAsync(up.device, up.pinned, kBytes, cudaMemcpyHostToDevice, s[0]));
  CHILD_RT(cudaMemcpyAsync(down.device, down.pinned, kBytes, cudaMemcpyHostToDevice, s[1]));
  CHILD_RT(endEach(2));
  t0 = gate.Open();
  CHILD_RT(cudaDeviceSynchronize());
  if (AtLeast("two copies on one engine, by the host", Now() - t0, 40 * kMs) ||
      inTurn("two copies on one engine", 20 * kMs))
    return 1;

  CHILD_RT(closeOn(2));
  CHILD_RT(LaunchTimed(15 * kMs, s[0]));
  CHILD_RT(LaunchTimed(15 * kMs, s[1]));
  CHILD_RT(endEach(2));
  t0 = gate.Open();
  CHILD_RT(cudaDeviceSynchronize());
  return AtLeast("two kernels, by the host", Now() - t0, 30 * kMs) ||
         inTurn("two kernels on the compute engine", 15 * kMs);
}

TEST(PlatformTiming, ThreeEnginesOverlapAndOneEngineTakesTurns) {
  ChildOptions opt;
  opt.set_env = {{"CUDASIM_H2D_GBPS", "1"}, {"CUDASIM_D2H_GBPS", "1"}};
  ChildResult r = RunChild("engines", opt);
  EXPECT_TRUE(r.exited && r.exit_code == 0) << r.output;
}

// From pageable memory, at half the bandwidth (at least twice the pinned time), and the call
// returns only once the copy is done.
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
    if (AtLeast("the call of a pageable copy", Now() - t0, 2 * kBytes)) return 1;
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

// Kernel time, timed mode or not: events and queries follow it. Untimed copies (no bandwidth
// set) take no modeled time: CUDASIM_VERBOSE's report counts the kernel's 25 ms and nothing else.
CONFORMANCE_CHILD(kernel_time) {
  RegisterKernels();
  cudaStream_t s;
  CHILD_RT(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  cudaEvent_t end;
  CHILD_RT(cudaEventCreate(&end));
  Gate gate;
  CHILD_RT(gate.Close());
  CHILD_RT(gate.Hold(s));
  CHILD_RT(LaunchTimed(25 * kMs, s));
  CHILD_RT(cudaEventRecord(end, s));
  if (cudaEventQuery(end) != cudaErrorNotReady) return ChildFail("event done too early", 1, 0);
  const int64_t t0 = gate.Open();
  CHILD_RT(cudaEventSynchronize(end));
  if (AtLeast("kernel by the host", Now() - t0, 25 * kMs) ||
      Exactly("kernel by events", gate.opened, end, 25 * kMs))
    return 1;
  constexpr size_t kBytes = 64 << 20;
  Buffers b(kBytes);
  CHILD_RT(cudaMemcpy(b.device, b.pinned, kBytes, cudaMemcpyHostToDevice));
  CHILD_RT(cudaMemcpy(b.pinned, b.device, kBytes, cudaMemcpyDeviceToHost));
  return 0;
}

TEST(PlatformTiming, KernelTimeWithoutBandwidthsAndEventsFollowIt) {
  ChildOptions opt;
  opt.unset_env = {"CUDASIM_H2D_GBPS", "CUDASIM_D2H_GBPS", "CUDASIM_D2D_GBPS"};
  opt.set_env = {{"CUDASIM_VERBOSE", "1"}};
  ChildResult r = RunChild("kernel_time", opt);
  EXPECT_TRUE(r.exited && r.exit_code == 0) << r.output;
  EXPECT_NE(r.output.find("compute busy 0.025000 s, host-to-device busy 0.000000 s, "
                          "device-to-host busy 0.000000 s"),
            std::string::npos)
      << r.output;
}

// A kernel whose body takes 30 ms on the host but declares 1 ms: the item ends with the host
// work, and CUDASIM_VERBOSE=1 says at exit that the run's times are not to be trusted.
CONFORMANCE_CHILD(overrun) {
  RegisterKernels();
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

// The compute engine left idle, by what the next kernel waited for: the host that had not
// submitted it (20 ms of the host doing nothing), a copy before it on its stream, a copy on
// another stream it waits for by an event (32 ms each at 1 GB/s, one after the other).
CONFORMANCE_CHILD(idle_causes) {
  RegisterKernels();
  cudaStream_t s, other;
  CHILD_RT(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  CHILD_RT(cudaStreamCreateWithFlags(&other, cudaStreamNonBlocking));
  constexpr size_t kBytes = 32 << 20;
  Buffers b(kBytes);
  CHILD_RT(LaunchTimed(1 * kMs, s));
  CHILD_RT(cudaStreamSynchronize(s));
  std::this_thread::sleep_for(std::chrono::milliseconds(20));
  CHILD_RT(LaunchTimed(1 * kMs, s));
  CHILD_RT(cudaMemcpyAsync(b.device, b.pinned, kBytes, cudaMemcpyHostToDevice, s));
  CHILD_RT(LaunchTimed(1 * kMs, s));
  cudaEvent_t before, copied;
  CHILD_RT(cudaEventCreate(&before));
  CHILD_RT(cudaEventCreate(&copied));
  CHILD_RT(cudaEventRecord(before, s));
  CHILD_RT(cudaStreamWaitEvent(other, before, 0));
  CHILD_RT(cudaMemcpyAsync(b.pinned, b.device, kBytes, cudaMemcpyDeviceToHost, other));
  CHILD_RT(cudaEventRecord(copied, other));
  CHILD_RT(cudaStreamWaitEvent(s, copied, 0));
  CHILD_RT(LaunchTimed(1 * kMs, s));
  CHILD_RT(cudaDeviceSynchronize());
  return 0;
}

TEST(PlatformTiming, IdleTimeIsToldByWhatTheNextKernelWaitedFor) {
  ChildOptions opt;
  opt.set_env = {{"CUDASIM_VERBOSE", "1"}, {"CUDASIM_H2D_GBPS", "1"}, {"CUDASIM_D2H_GBPS", "1"}};
  ChildResult r = RunChild("idle_causes", opt);
  ASSERT_TRUE(r.exited && r.exit_code == 0) << r.output;
  const size_t at = r.output.find("compute idle between items");
  ASSERT_NE(at, std::string::npos) << r.output;
  double all = 0, host = 0, copy = 0, events = 0;
  ASSERT_EQ(std::sscanf(r.output.c_str() + at,
                        "compute idle between items %lf s: %lf s for work the host had not "
                        "submitted, %lf s after the stream's previous item (a copy), %lf s for "
                        "other streams (events)",
                        &all, &host, &copy, &events),
            4)
      << r.output;
  // From below only: a host slower than the model leaves the engine idle longer.
  EXPECT_GE(host, 0.019) << r.output;
  EXPECT_GE(copy, 0.030) << r.output;
  EXPECT_GE(events, 0.030) << r.output;
  EXPECT_NEAR(all, host + copy + events, 2e-6) << r.output;
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
