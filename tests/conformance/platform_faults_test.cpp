/* cudasim's injected faults (CUDASIM_FAULTS and the cudasimSetFaults hook, driver/faults.h):
 * each does what its documentation says and nothing more, only calls that pass the argument
 * checks count, and a bad spec is refused with one line. Each case runs in a fresh child:
 * the faults are process-wide. */
#include <cudasim/cudasim.h>
#include <cupti.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <string>
#include <vector>

#include "conformance_util.h"

namespace conformance {
namespace {

int Context() {
  if (CUresult r = cuInit(0); r != CUDA_SUCCESS) return ChildFail("cuInit", r, 0);
  CUcontext ctx;
  if (CUresult r = cuDevicePrimaryCtxRetain(&ctx, 0); r != CUDA_SUCCESS)
    return ChildFail("retain", r, 0);
  if (CUresult r = cuCtxSetCurrent(ctx); r != CUDA_SUCCESS) return ChildFail("set current", r, 0);
  return 0;
}

int SetFaults(const char* spec) {
  if (const char* error = cudasimSetFaults(spec)) {
    std::fprintf(stderr, "cudasimSetFaults(\"%s\"): %s\n", spec, error);
    return 1;
  }
  return 0;
}

#define CHILD_EXPECT(call, expected)                                   \
  do {                                                                 \
    auto got_ = (call);                                                \
    if (got_ != (expected)) return ChildFail(#call, got_, (expected)); \
  } while (0)

CUmemAllocationProp DeviceProp() {
  CUmemAllocationProp prop{};
  prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
  prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  prop.location.id = 0;
  return prop;
}

CONFORMANCE_CHILD(faults_memcreate) {
  if (int rc = Context(); rc != 0) return rc;
  if (int rc = SetFaults("memcreate-fail-after=1:1"); rc != 0) return rc;
  const CUmemAllocationProp prop = DeviceProp();
  CUmemGenericAllocationHandle h[3];
  // A misuse is reported as such and does not count.
  CHILD_EXPECT(cuMemCreate(&h[0], 12345, &prop, 0), CUDA_ERROR_INVALID_VALUE);
  CHILD_EXPECT(cuMemCreate(&h[0], 2 << 20, &prop, 0), CUDA_SUCCESS);
  CHILD_EXPECT(cuMemCreate(&h[1], 2 << 20, &prop, 0), CUDA_ERROR_OUT_OF_MEMORY);
  CHILD_EXPECT(cuMemCreate(&h[2], 2 << 20, &prop, 0), CUDA_SUCCESS);
  // cuMemAlloc is not cuMemCreate.
  if (int rc = SetFaults("memcreate-fail-after=0"); rc != 0) return rc;
  CUdeviceptr p = 0;
  CHILD_EXPECT(cuMemAlloc(&p, 1 << 20), CUDA_SUCCESS);
  CHILD_EXPECT(cuMemCreate(&h[1], 2 << 20, &prop, 0), CUDA_ERROR_OUT_OF_MEMORY);
  CHILD_EXPECT(cuMemCreate(&h[1], 2 << 20, &prop, 0), CUDA_ERROR_OUT_OF_MEMORY);
  // Cleared: everything works again.
  if (int rc = SetFaults(""); rc != 0) return rc;
  CHILD_EXPECT(cuMemCreate(&h[1], 2 << 20, &prop, 0), CUDA_SUCCESS);
  return 0;
}

TEST(PlatformFaults, MemCreateFailsAfterNCallsForKCalls) {
  ChildResult r = RunChild("faults_memcreate");
  EXPECT_TRUE(r.exited && r.exit_code == 0) << r.output;
}

// Device: 64 MiB (CUDASIM_DEVICE_MEMORY); another process holds 40 MiB.
CONFORMANCE_CHILD(faults_device_taken) {
  if (int rc = Context(); rc != 0) return rc;
  size_t free = 0, total = 0;
  CHILD_EXPECT(cuMemGetInfo(&free, &total), CUDA_SUCCESS);
  CHILD_EXPECT(total, size_t(64) << 20);
  CHILD_EXPECT(free, size_t(24) << 20);
  CUdeviceptr p = 0;
  CHILD_EXPECT(cuMemAlloc(&p, 32 << 20), CUDA_ERROR_OUT_OF_MEMORY);
  CHILD_EXPECT(cuMemAlloc(&p, 16 << 20), CUDA_SUCCESS);
  const CUmemAllocationProp prop = DeviceProp();
  CUmemGenericAllocationHandle h;
  CHILD_EXPECT(cuMemCreate(&h, 10 << 20, &prop, 0), CUDA_ERROR_OUT_OF_MEMORY);
  CHILD_EXPECT(cuMemCreate(&h, 8 << 20, &prop, 0), CUDA_SUCCESS);
  // The other process lets go.
  if (int rc = SetFaults(""); rc != 0) return rc;
  CHILD_EXPECT(cuMemAlloc(&p, 32 << 20), CUDA_SUCCESS);
  return 0;
}

TEST(PlatformFaults, DeviceTakenByAnotherProcess) {
  ChildOptions opt;
  opt.set_env = {{"CUDASIM_DEVICE_MEMORY", "64M"}, {"CUDASIM_FAULTS", "device-taken=40M"}};
  ChildResult r = RunChild("faults_device_taken", opt);
  EXPECT_TRUE(r.exited && r.exit_code == 0) << r.output;
}

CONFORMANCE_CHILD(faults_copies) {
  if (int rc = Context(); rc != 0) return rc;
  CUdeviceptr d = 0;
  CHILD_EXPECT(cuMemAlloc(&d, 4096), CUDA_SUCCESS);
  std::vector<unsigned char> host(4096, 7);
  if (int rc = SetFaults("htod-fail-after=1:1"); rc != 0) return rc;
  CHILD_EXPECT(cuMemcpyHtoD(d, nullptr, 4096), CUDA_ERROR_INVALID_VALUE);  // not counted
  CHILD_EXPECT(cuMemcpyHtoD(d, host.data(), 4096), CUDA_SUCCESS);
  CHILD_EXPECT(cuMemcpyDtoH(host.data(), d, 4096), CUDA_SUCCESS);  // other direction
  CHILD_EXPECT(cuMemcpyHtoDAsync(d, host.data(), 4096, nullptr), CUDA_ERROR_OUT_OF_MEMORY);
  CHILD_EXPECT(cuMemcpyHtoD(d, host.data(), 4096), CUDA_SUCCESS);
  if (int rc = SetFaults("dtoh-fail-after=0"); rc != 0) return rc;
  CHILD_EXPECT(cuMemcpyHtoD(d, host.data(), 4096), CUDA_SUCCESS);
  CHILD_EXPECT(cuMemcpyDtoH(host.data(), d, 4096), CUDA_ERROR_OUT_OF_MEMORY);
  CHILD_EXPECT(cuMemcpyDtoHAsync(host.data(), d, 4096, nullptr), CUDA_ERROR_OUT_OF_MEMORY);
  if (int rc = SetFaults("copy-fail-after=2"); rc != 0) return rc;
  CUdeviceptr d2 = 0;
  CHILD_EXPECT(cuMemAlloc(&d2, 4096), CUDA_SUCCESS);
  CHILD_EXPECT(cuMemcpyDtoD(d2, d, 4096), CUDA_SUCCESS);
  CHILD_EXPECT(cuMemcpyHtoD(d, host.data(), 4096), CUDA_SUCCESS);
  CHILD_EXPECT(cuMemcpyDtoD(d2, d, 4096), CUDA_ERROR_OUT_OF_MEMORY);
  CHILD_EXPECT(cudaMemcpy(host.data(), reinterpret_cast<void*>(d), 4096, cudaMemcpyDeviceToHost),
               cudaErrorMemoryAllocation);  // the runtime's copies go through the same door
  // A failed copy copies nothing.
  if (int rc = SetFaults(""); rc != 0) return rc;
  CHILD_EXPECT(cuMemsetD8(d, 1, 4096), CUDA_SUCCESS);
  if (int rc = SetFaults("htod-fail-after=0:1"); rc != 0) return rc;
  std::vector<unsigned char> twos(4096, 2);
  CHILD_EXPECT(cuMemcpyHtoD(d, twos.data(), 4096), CUDA_ERROR_OUT_OF_MEMORY);
  CHILD_EXPECT(cuMemcpyDtoH(host.data(), d, 4096), CUDA_SUCCESS);
  CHILD_EXPECT(int(host[100]), 1);
  return 0;
}

TEST(PlatformFaults, CopiesFailByDirectionAfterNCalls) {
  ChildResult r = RunChild("faults_copies");
  EXPECT_TRUE(r.exited && r.exit_code == 0) << r.output;
}

CONFORMANCE_CHILD(faults_pinned) {
  if (int rc = Context(); rc != 0) return rc;
  void* a = nullptr;
  void* b = nullptr;
  if (int rc = SetFaults("hostalloc-fail-after=0:1"); rc != 0) return rc;
  CHILD_EXPECT(cuMemHostAlloc(&a, 4096, 0x80), CUDA_ERROR_INVALID_VALUE);  // bad flags: not counted
  CHILD_EXPECT(cuMemHostAlloc(&a, 4096, 0), CUDA_ERROR_OUT_OF_MEMORY);
  CHILD_EXPECT(cuMemAllocHost(&a, 4096), CUDA_SUCCESS);
  CHILD_EXPECT(cuMemFreeHost(a), CUDA_SUCCESS);
  if (int rc = SetFaults("pinned-limit=1M"); rc != 0) return rc;
  CHILD_EXPECT(cuMemHostAlloc(&a, 512 << 10, 0), CUDA_SUCCESS);
  CHILD_EXPECT(cuMemHostAlloc(&b, 768 << 10, 0), CUDA_ERROR_OUT_OF_MEMORY);
  CHILD_EXPECT(cudaHostAlloc(&b, 768 << 10, 0), cudaErrorMemoryAllocation);
  std::vector<unsigned char> pageable(768 << 10);
  CHILD_EXPECT(cuMemHostRegister(pageable.data(), pageable.size(), 0), CUDA_ERROR_OUT_OF_MEMORY);
  CHILD_EXPECT(cuMemHostAlloc(&b, 512 << 10, 0), CUDA_SUCCESS);  // exactly the limit
  CHILD_EXPECT(cuMemFreeHost(a), CUDA_SUCCESS);
  CHILD_EXPECT(cuMemHostRegister(pageable.data(), 512 << 10, 0), CUDA_SUCCESS);
  CHILD_EXPECT(cuMemHostUnregister(pageable.data()), CUDA_SUCCESS);
  CHILD_EXPECT(cuMemFreeHost(b), CUDA_SUCCESS);
  return 0;
}

TEST(PlatformFaults, PinnedHostMemoryFailsOrRunsOut) {
  ChildResult r = RunChild("faults_pinned");
  EXPECT_TRUE(r.exited && r.exit_code == 0) << r.output;
}

long long MillisecondsSince(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now() -
                                                               start)
      .count();
}

CONFORMANCE_CHILD(faults_slow) {
  if (int rc = Context(); rc != 0) return rc;
  CUdeviceptr d = 0;
  CHILD_EXPECT(cuMemAlloc(&d, 4096), CUDA_SUCCESS);
  void* pinned = nullptr;
  CHILD_EXPECT(cuMemHostAlloc(&pinned, 4096, 0), CUDA_SUCCESS);
  CUstream stream;
  CHILD_EXPECT(cuStreamCreate(&stream, CU_STREAM_NON_BLOCKING), CUDA_SUCCESS);
  // A slow copy: the call returns at once, the stream is busy, then done.
  if (int rc = SetFaults("slow-copy-us=300000"); rc != 0) return rc;
  auto start = std::chrono::steady_clock::now();
  CHILD_EXPECT(cuMemcpyHtoDAsync(d, pinned, 4096, stream), CUDA_SUCCESS);
  CHILD_EXPECT(cuStreamQuery(stream), CUDA_ERROR_NOT_READY);  // returned before the copy ran
  // A memset is not a copy: not delayed itself, but queued behind the slow copy.
  CHILD_EXPECT(cuMemsetD8Async(d, 3, 4096, stream), CUDA_SUCCESS);
  CHILD_EXPECT(cuStreamSynchronize(stream), CUDA_SUCCESS);
  if (MillisecondsSince(start) < 250) return ChildFail("slow copy took (ms)", MillisecondsSince(start), 300);
  // A slow stream delays every item, memsets included.
  if (int rc = SetFaults("slow-stream-us=300000"); rc != 0) return rc;
  start = std::chrono::steady_clock::now();
  CHILD_EXPECT(cuMemsetD8Async(d, 4, 4096, stream), CUDA_SUCCESS);
  CHILD_EXPECT(cuStreamQuery(stream), CUDA_ERROR_NOT_READY);
  CHILD_EXPECT(cuStreamSynchronize(stream), CUDA_SUCCESS);
  if (MillisecondsSince(start) < 250) return ChildFail("slow memset took (ms)", MillisecondsSince(start), 300);
  unsigned char byte = 0;
  CHILD_EXPECT(cuMemcpyDtoH(&byte, d, 1), CUDA_SUCCESS);  // late, but right
  CHILD_EXPECT(int(byte), 4);
  return 0;
}

TEST(PlatformFaults, SlowCopiesAndStreamsAreLateNotWrong) {
  ChildResult r = RunChild("faults_slow");
  EXPECT_TRUE(r.exited && r.exit_code == 0) << r.output;
}

void CUPTIAPI Ignore(void*, CUpti_CallbackDomain, CUpti_CallbackId, const void*) {}

CONFORMANCE_CHILD(faults_cupti) {
  if (int rc = Context(); rc != 0) return rc;
  CUpti_SubscriberHandle subscriber = nullptr;
  if (int rc = SetFaults("cupti-subscribe-fail"); rc != 0) return rc;
  CHILD_EXPECT(cuptiSubscribe(&subscriber, Ignore, nullptr), CUPTI_ERROR_NOT_INITIALIZED);
  if (int rc = SetFaults("cupti-enable-fail"); rc != 0) return rc;
  CHILD_EXPECT(cuptiSubscribe(&subscriber, Ignore, nullptr), CUPTI_SUCCESS);
  CHILD_EXPECT(cuptiEnableCallback(1, subscriber, CUPTI_CB_DOMAIN_RUNTIME_API,
                                   CUPTI_RUNTIME_TRACE_CBID_cudaMalloc_v3020),
               CUPTI_ERROR_NOT_INITIALIZED);
  CHILD_EXPECT(cuptiEnableDomain(1, subscriber, CUPTI_CB_DOMAIN_DRIVER_API),
               CUPTI_ERROR_NOT_INITIALIZED);
  uint32_t enabled = 1;
  CHILD_EXPECT(cuptiGetCallbackState(&enabled, subscriber, CUPTI_CB_DOMAIN_RUNTIME_API,
                                     CUPTI_RUNTIME_TRACE_CBID_cudaMalloc_v3020),
               CUPTI_SUCCESS);
  CHILD_EXPECT(enabled, 0u);
  CHILD_EXPECT(cuptiUnsubscribe(subscriber), CUPTI_SUCCESS);
  return 0;
}

TEST(PlatformFaults, CuptiRefusesSubscriptionOrCallbacks) {
  ChildResult r = RunChild("faults_cupti");
  EXPECT_TRUE(r.exited && r.exit_code == 0) << r.output;
}

CONFORMANCE_CHILD(faults_hook_refuses) {
  // A bad spec leaves the faults in force as they were.
  if (int rc = Context(); rc != 0) return rc;
  if (int rc = SetFaults("memcreate-fail-after=0"); rc != 0) return rc;
  for (const char* bad : {"memcreate-fail-after=x", "memcreate-fail-after=1:0", "nope", ",",
                          "slow-copy-us=20000000", "cupti-enable-fail=1", "device-taken=0"}) {
    const char* error = cudasimSetFaults(bad);
    if (error == nullptr || *error == '\0') {
      std::fprintf(stderr, "cudasimSetFaults(\"%s\") was accepted\n", bad);
      return 1;
    }
  }
  const CUmemAllocationProp prop = DeviceProp();
  CUmemGenericAllocationHandle h;
  CHILD_EXPECT(cuMemCreate(&h, 2 << 20, &prop, 0), CUDA_ERROR_OUT_OF_MEMORY);
  return 0;
}

TEST(PlatformFaults, HookRefusesBadSpecsAndKeepsThePlan) {
  ChildResult r = RunChild("faults_hook_refuses");
  EXPECT_TRUE(r.exited && r.exit_code == 0) << r.output;
}

CONFORMANCE_CHILD(faults_env) {
  if (int rc = Context(); rc != 0) return rc;
  const CUmemAllocationProp prop = DeviceProp();
  CUmemGenericAllocationHandle h;
  CHILD_EXPECT(cuMemCreate(&h, 2 << 20, &prop, 0), CUDA_SUCCESS);
  CHILD_EXPECT(cuMemCreate(&h, 2 << 20, &prop, 0), CUDA_ERROR_OUT_OF_MEMORY);
  void* p = nullptr;
  CHILD_EXPECT(cuMemHostAlloc(&p, 4096, 0), CUDA_ERROR_OUT_OF_MEMORY);
  return 0;
}

TEST(PlatformFaults, EnvironmentVariableSetsThePlanAtStart) {
  ChildOptions opt;
  opt.set_env = {{"CUDASIM_FAULTS", "memcreate-fail-after=1,hostalloc-fail-after=0,slow-copy-us=0"}};
  ChildResult r = RunChild("faults_env", opt);
  EXPECT_TRUE(r.exited && r.exit_code == 0) << r.output;
}

TEST(PlatformFaults, BadEnvironmentStopsAtStartWithOneLine) {
  for (const char* bad : {"bogus", "memcreate-fail-after", "memcreate-fail-after=", "memcreate-fail-after=-1",
                          "memcreate-fail-after=1:", "memcreate-fail-after=99999999999999999999999",
                          "device-taken=12 parsecs", "pinned-limit=1.5G", "slow-stream-us=1e3",
                          "cupti-subscribe-fail=yes", "hostalloc-fail-after=1,,", " slow-copy-us=1"}) {
    SCOPED_TRACE(bad);
    ChildOptions opt;
    opt.set_env = {{"CUDASIM_FAULTS", bad}};
    ChildResult r = RunChild("faults_env", opt);
    EXPECT_TRUE(r.exited) << r.output;
    EXPECT_EQ(r.exit_code, 2) << r.output;
    EXPECT_EQ(r.output.rfind("cudasim: CUDASIM_FAULTS='", 0), 0u) << r.output;
    EXPECT_EQ(std::count(r.output.begin(), r.output.end(), '\n'), 1) << r.output;
  }
}

}  // namespace
}  // namespace conformance
