// Faults cudasim injects on request, so that tests can see what a program (or a tool in front
// of it, such as libdelta.so) does when the platform fails the way a real one can: the device
// is full, a copy fails, a stream is very slow, pinned host memory runs out, CUPTI refuses a
// subscriber.
//
// Requested with CUDASIM_FAULTS (read once, at the first use of the driver; a bad value ends
// the process with one line, exit status 2), or changed at any time with the test hook
// cudasimSetFaults() (cudasim.h), which replaces the whole plan and restarts its counters.
// The syntax, one item or several separated by commas:
//
//   memcreate-fail-after=N[:K]  cuMemCreate fails with CUDA_ERROR_OUT_OF_MEMORY (the device is
//                               full): after the first N calls, the next K, or every later
//                               call without ":K"
//   device-taken=SIZE           another process holds SIZE bytes of the device: cuMemAlloc and
//                               cuMemCreate fail with CUDA_ERROR_OUT_OF_MEMORY beyond what is
//                               left, cuMemGetInfo reports it as used (the total is unchanged)
//   copy-fail-after=N[:K]       copies (cuMemcpy*, and the runtime's through them) fail with
//   htod-fail-after=N[:K]       CUDA_ERROR_OUT_OF_MEMORY, as when the driver cannot get the
//   dtoh-fail-after=N[:K]       resources for one: every direction, host to device only, or
//                               device to host only; counted per item
//   slow-stream-us=U            every item of work on every stream starts U microseconds late
//   slow-copy-us=U              every copy runs U microseconds late (a slow link)
//   hostalloc-fail-after=N[:K]  cuMemHostAlloc and cuMemAllocHost fail with
//                               CUDA_ERROR_OUT_OF_MEMORY
//   pinned-limit=SIZE           pinned host memory (allocated and registered) totals at most
//                               SIZE; beyond it those calls fail with CUDA_ERROR_OUT_OF_MEMORY
//                               (the system's limit on locked memory)
//   cupti-subscribe-fail        cuptiSubscribe fails with CUPTI_ERROR_NOT_INITIALIZED
//   cupti-enable-fail           cuptiEnableCallback/Domain/AllDomains fail with
//                               CUPTI_ERROR_NOT_INITIALIZED
//   paraminfo-fail[=TEXT]       cuFuncGetParamInfo and cuKernelGetParamInfo fail with
//                               CUDA_ERROR_NOT_SUPPORTED: no kernel's parameters can be read
//                               (as for a kernel a tool cannot describe), so no launch can be
//                               analysed; with TEXT, only for kernels whose name contains it
//                               (some kernels of a job opaque, the rest not)
//   foreign-stubs               cudaGetFuncBySymbol fails for every symbol, as for the stubs of
//                               a runtime linked statically into a library (cuBLAS, cuDNN):
//                               launches still run, and their driver calls name the function
//
// SIZE is a decimal byte count with an optional K, M, G or T (powers of 1024); N, K and U are
// decimal integers. Only calls that pass the argument checks count and fail: a fault never
// hides a misuse the real driver would report first.
#pragma once

#include <atomic>
#include <cstdint>
#include <string>

namespace cudasim {

// "After the first `after` calls, the next `count` fail (0: every later one)".
class CallFault {
 public:
  void arm(uint64_t after, uint64_t count);
  void disarm() { armed_.store(false); }
  // Counts one call; true when this call must fail.
  bool fires();

 private:
  std::atomic<bool> armed_{false};
  std::atomic<uint64_t> after_{0};
  std::atomic<uint64_t> count_{0};
  std::atomic<uint64_t> calls_{0};
};

struct Faults {
  CallFault memCreate;
  CallFault anyCopy;
  CallFault hostToDevice;
  CallFault deviceToHost;
  CallFault hostAlloc;
  std::atomic<uint64_t> deviceTaken{0};
  std::atomic<uint64_t> pinnedLimit{0};  // 0: no limit
  std::atomic<uint32_t> slowStreamUs{0};
  std::atomic<uint32_t> slowCopyUs{0};
  std::atomic<bool> cuptiSubscribeFail{false};
  std::atomic<bool> cuptiEnableFail{false};
  std::atomic<bool> paramInfoFail{false};
  // With paramInfoFail: only kernels whose name contains this (nullptr: every kernel). Never
  // freed (faults.cpp keeps every one), so that a reader racing a new plan reads a string that
  // still exists.
  std::atomic<const std::string*> paramInfoFailText{nullptr};
  std::atomic<bool> foreignStubs{false};

  bool paramInfoFails(const std::string& kernelName) const {
    if (!paramInfoFail.load(std::memory_order_relaxed)) return false;
    const std::string* text = paramInfoFailText.load(std::memory_order_acquire);
    return text == nullptr || kernelName.find(*text) != std::string::npos;
  }
};

// The plan in force: CUDASIM_FAULTS, parsed at the first call (a bad value ends the process).
Faults& faults();

// Replaces the plan in force with `spec` ("" or nullptr: no faults). Returns nullptr, or a
// one-line reason (static storage, valid until the next call) and leaves the plan unchanged.
const char* setFaults(const char* spec);

// Copy directions, for copyFails().
enum class CopyDirection { kHostToDevice, kDeviceToHost, kOther };
// Counts one copy against the copy faults; true when it must fail.
bool copyFails(CopyDirection direction);

}  // namespace cudasim
