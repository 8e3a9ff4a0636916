/* The runtime API: devices, memory, copies, streams, events, host memory, errors and the
 * sticky/non-sticky last error, and its sharing of the driver's primary context.
 * Real CUDA API only. */
#include <sys/mman.h>
#include <unistd.h>

#include <cstring>
#include <thread>
#include <vector>

#include "conformance_util.h"

namespace conformance {
namespace {

class Runtime : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_RT(cudaSetDevice(0));
    (void)cudaGetLastError();
  }
  void TearDown() override {
    gate_.Open();
    EXPECT_FALSE(gate_.timed_out());
    EXPECT_RT(cudaDeviceSynchronize());
  }
  Gate gate_;
  OrderLog log_;
};

TEST_F(Runtime, Versions) {
  int driver = 0, runtime = 0;
  ASSERT_RT(cudaDriverGetVersion(&driver));
  ASSERT_RT(cudaRuntimeGetVersion(&runtime));
  EXPECT_GE(driver, 13000);
  EXPECT_GE(runtime, 13000);
  EXPECT_GE(driver, runtime);
}

TEST_F(Runtime, DeviceCountPropertiesAndSelection) {
  int count = 0;
  ASSERT_RT(cudaGetDeviceCount(&count));
  ASSERT_GE(count, 1);
  cudaDeviceProp prop;
  std::memset(&prop, 0, sizeof prop);
  ASSERT_RT(cudaGetDeviceProperties(&prop, 0));
  EXPECT_GT(std::strlen(prop.name), 0u);
  EXPECT_GT(prop.totalGlobalMem, 0u);
  EXPECT_GE(prop.major, 1);
  size_t free_b = 0, total = 0;
  ASSERT_RT(cudaMemGetInfo(&free_b, &total));
  EXPECT_EQ(prop.totalGlobalMem, total);
  int dev = -1;
  ASSERT_RT(cudaGetDevice(&dev));
  EXPECT_EQ(dev, 0);
  EXPECT_RT_EQ(cudaErrorInvalidDevice, cudaSetDevice(count));
  EXPECT_RT_EQ(cudaErrorInvalidDevice, cudaGetDeviceProperties(&prop, count));
  (void)cudaGetLastError();
}

TEST_F(Runtime, RuntimeUsesThePrimaryContext) {
  ASSERT_RT(cudaFree(nullptr));  // initialises the runtime on device 0
  CUcontext cur = nullptr, primary = nullptr;
  ASSERT_CU(cuCtxGetCurrent(&cur));
  CUdevice dev;
  ASSERT_CU(cuDeviceGet(&dev, 0));
  ASSERT_CU(cuDevicePrimaryCtxRetain(&primary, dev));
  EXPECT_EQ(cur, primary);
  // Memory from one API is usable by the other.
  void* p = nullptr;
  ASSERT_RT(cudaMalloc(&p, 4096));
  ASSERT_CU(cuMemsetD8(reinterpret_cast<CUdeviceptr>(p), 0x21, 4096));
  unsigned char b = 0;
  ASSERT_RT(cudaMemcpy(&b, p, 1, cudaMemcpyDeviceToHost));
  EXPECT_EQ(b, 0x21);
  ASSERT_CU(cuMemFree(reinterpret_cast<CUdeviceptr>(p)));
  ASSERT_CU(cuDevicePrimaryCtxRelease(dev));
}

TEST_F(Runtime, MallocCopyMemsetFree) {
  void* d = nullptr;
  ASSERT_RT(cudaMalloc(&d, 1 << 16));
  ASSERT_NE(d, nullptr);
  std::vector<unsigned char> in(1 << 16), out(1 << 16);
  for (size_t i = 0; i < in.size(); ++i) in[i] = static_cast<unsigned char>(i);
  ASSERT_RT(cudaMemcpy(d, in.data(), in.size(), cudaMemcpyHostToDevice));
  void* d2 = nullptr;
  ASSERT_RT(cudaMalloc(&d2, 1 << 16));
  ASSERT_RT(cudaMemcpy(d2, d, in.size(), cudaMemcpyDeviceToDevice));
  ASSERT_RT(cudaMemcpy(out.data(), d2, out.size(), cudaMemcpyDeviceToHost));
  EXPECT_EQ(in, out);
  ASSERT_RT(cudaMemset(d2, 0x7f, 100));
  ASSERT_RT(cudaMemcpy(out.data(), d2, out.size(), cudaMemcpyDefault));
  EXPECT_EQ(out[99], 0x7f);
  EXPECT_EQ(out[100], 100);
  ASSERT_RT(cudaFree(d));
  ASSERT_RT(cudaFree(d2));
}

TEST_F(Runtime, FreeNullIsANoOp) { EXPECT_RT(cudaFree(nullptr)); }

TEST_F(Runtime, FreeTwiceIsInvalidValue) {
  void* d = nullptr;
  ASSERT_RT(cudaMalloc(&d, 4096));
  ASSERT_RT(cudaFree(d));
  EXPECT_RT_EQ(cudaErrorInvalidValue, cudaFree(d));
  (void)cudaGetLastError();
}

TEST_F(Runtime, MallocBeyondCapacityIsMemoryAllocationAndNotSticky) {
  size_t free_b = 0, total = 0;
  ASSERT_RT(cudaMemGetInfo(&free_b, &total));
  void* d = nullptr;
  EXPECT_RT_EQ(cudaErrorMemoryAllocation, cudaMalloc(&d, total + (1ull << 30)));
  EXPECT_RT_EQ(cudaErrorMemoryAllocation, cudaPeekAtLastError());
  EXPECT_RT_EQ(cudaErrorMemoryAllocation, cudaPeekAtLastError());  // peek does not reset
  EXPECT_RT_EQ(cudaErrorMemoryAllocation, cudaGetLastError());
  EXPECT_RT(cudaGetLastError());  // reset
  ASSERT_RT(cudaMalloc(&d, 4096));
  ASSERT_RT(cudaFree(d));
}

TEST_F(Runtime, LastErrorIsPerThread) {
  void* d = nullptr;
  size_t free_b = 0, total = 0;
  ASSERT_RT(cudaMemGetInfo(&free_b, &total));
  EXPECT_RT_EQ(cudaErrorMemoryAllocation, cudaMalloc(&d, total + (1ull << 30)));
  cudaError_t other = cudaErrorUnknown;
  std::thread t([&] { other = cudaGetLastError(); });
  t.join();
  EXPECT_RT_EQ(cudaSuccess, other);
  EXPECT_RT_EQ(cudaErrorMemoryAllocation, cudaGetLastError());
}

TEST_F(Runtime, MemGetInfoDropsWithMalloc) {
  size_t free0 = 0, free1 = 0, total = 0;
  ASSERT_RT(cudaMemGetInfo(&free0, &total));
  void* d = nullptr;
  ASSERT_RT(cudaMalloc(&d, 32u << 20));
  ASSERT_RT(cudaMemGetInfo(&free1, &total));
  EXPECT_LE(free1 + (32u << 20), free0);
  ASSERT_RT(cudaFree(d));
}

TEST_F(Runtime, ErrorStringsAndNames) {
  EXPECT_STREQ(cudaGetErrorName(cudaErrorMemoryAllocation), "cudaErrorMemoryAllocation");
  EXPECT_STREQ(cudaGetErrorString(cudaErrorMemoryAllocation), "out of memory");
  EXPECT_STREQ(cudaGetErrorName(cudaSuccess), "cudaSuccess");
  EXPECT_STREQ(cudaGetErrorString(cudaSuccess), "no error");
  EXPECT_STREQ(cudaGetErrorName(cudaErrorInvalidValue), "cudaErrorInvalidValue");
  EXPECT_STREQ(cudaGetErrorString(cudaErrorInvalidValue), "invalid argument");
  EXPECT_STREQ(cudaGetErrorName(cudaErrorInsufficientDriver), "cudaErrorInsufficientDriver");
  EXPECT_STREQ(cudaGetErrorName(cudaErrorNotReady), "cudaErrorNotReady");
}

TEST_F(Runtime, StreamsRunLateAndInOrder) {
  cudaStream_t s;
  ASSERT_RT(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  void* d = nullptr;
  ASSERT_RT(cudaMalloc(&d, 4096));
  ASSERT_RT(cudaMemset(d, 0, 4096));
  ASSERT_RT(cudaDeviceSynchronize());  // a memset may return before it is done
  void* h = nullptr;
  ASSERT_RT(cudaMallocHost(&h, 4096));
  std::memset(h, 0x10, 4096);
  ASSERT_RT(cudaLaunchHostFunc(s, Gate::BlockHostFn, &gate_));
  ASSERT_RT(cudaMemcpyAsync(d, h, 4096, cudaMemcpyHostToDevice, s));
  ASSERT_RT(cudaMemsetAsync(d, 0x20, 16, s));
  EXPECT_RT_EQ(cudaErrorNotReady, cudaStreamQuery(s));
  std::memset(h, 0x30, 4096);  // pinned: read when the copy executes
  gate_.Open();
  ASSERT_RT(cudaStreamSynchronize(s));
  EXPECT_RT(cudaStreamQuery(s));
  unsigned char out[32];
  ASSERT_RT(cudaMemcpy(out, d, 32, cudaMemcpyDeviceToHost));
  EXPECT_EQ(out[0], 0x20);
  EXPECT_EQ(out[16], 0x30);
  ASSERT_RT(cudaStreamDestroy(s));
  ASSERT_RT(cudaFreeHost(h));
  ASSERT_RT(cudaFree(d));
  (void)cudaGetLastError();
}

TEST_F(Runtime, EventsOrderStreamsAndTime) {
  cudaStream_t a, b;
  ASSERT_RT(cudaStreamCreateWithFlags(&a, cudaStreamNonBlocking));
  ASSERT_RT(cudaStreamCreateWithFlags(&b, cudaStreamNonBlocking));
  cudaEvent_t start, stop;
  ASSERT_RT(cudaEventCreate(&start));
  ASSERT_RT(cudaEventCreate(&stop));
  EXPECT_RT(cudaEventQuery(stop));  // never recorded: complete
  ASSERT_RT(cudaEventRecord(start, a));
  GatedMarker ga{&gate_, &log_, "a"};
  ASSERT_RT(cudaLaunchHostFunc(a, GatedMarker::HostFn, &ga));
  ASSERT_RT(cudaEventRecord(stop, a));
  EXPECT_RT_EQ(cudaErrorNotReady, cudaEventQuery(stop));
  float ms = 0;
  EXPECT_RT_EQ(cudaErrorNotReady, cudaEventElapsedTime(&ms, start, stop));
  ASSERT_RT(cudaStreamWaitEvent(b, stop, 0));
  Marker mb{&log_, "b"};
  ASSERT_RT(cudaLaunchHostFunc(b, Marker::HostFn, &mb));
  EXPECT_FALSE(log_.WaitFor("b", kNegativeWait));
  gate_.Open();
  ASSERT_RT(cudaEventSynchronize(stop));
  ASSERT_RT(cudaStreamSynchronize(b));
  EXPECT_EQ(log_.Marks(), (std::vector<std::string>{"a", "b"}));
  ASSERT_RT(cudaEventElapsedTime(&ms, start, stop));
  EXPECT_GE(ms, 0.0f);
  ASSERT_RT(cudaEventDestroy(start));
  ASSERT_RT(cudaEventDestroy(stop));
  ASSERT_RT(cudaStreamDestroy(a));
  ASSERT_RT(cudaStreamDestroy(b));
  (void)cudaGetLastError();
}

TEST_F(Runtime, ElapsedTimeErrors) {
  cudaEvent_t timed, untimed, unrecorded;
  ASSERT_RT(cudaEventCreate(&timed));
  ASSERT_RT(cudaEventCreateWithFlags(&untimed, cudaEventDisableTiming));
  ASSERT_RT(cudaEventCreate(&unrecorded));
  ASSERT_RT(cudaEventRecord(timed, nullptr));
  ASSERT_RT(cudaEventRecord(untimed, nullptr));
  ASSERT_RT(cudaDeviceSynchronize());
  float ms = 0;
  EXPECT_RT_EQ(cudaErrorInvalidResourceHandle, cudaEventElapsedTime(&ms, timed, untimed));
  EXPECT_RT_EQ(cudaErrorInvalidResourceHandle, cudaEventElapsedTime(&ms, timed, unrecorded));
  ASSERT_RT(cudaEventDestroy(timed));
  ASSERT_RT(cudaEventDestroy(untimed));
  ASSERT_RT(cudaEventDestroy(unrecorded));
  (void)cudaGetLastError();
}

TEST_F(Runtime, DeviceSynchronizeWaitsForAllStreams) {
  cudaStream_t a;
  ASSERT_RT(cudaStreamCreateWithFlags(&a, cudaStreamNonBlocking));
  GatedMarker ga{&gate_, &log_, "a"};
  ASSERT_RT(cudaLaunchHostFunc(a, GatedMarker::HostFn, &ga));
  std::thread opener([&] {
    std::this_thread::sleep_for(kNegativeWait);
    gate_.Open();
  });
  ASSERT_RT(cudaDeviceSynchronize());
  EXPECT_TRUE(log_.Has("a"));
  opener.join();
  ASSERT_RT(cudaStreamDestroy(a));
}

TEST_F(Runtime, FreeWaitsForOutstandingWork) {
  cudaStream_t a;
  ASSERT_RT(cudaStreamCreateWithFlags(&a, cudaStreamNonBlocking));
  void* d = nullptr;
  ASSERT_RT(cudaMalloc(&d, 4096));
  GatedMarker ga{&gate_, &log_, "work"};
  ASSERT_RT(cudaLaunchHostFunc(a, GatedMarker::HostFn, &ga));
  ASSERT_RT(cudaMemsetAsync(d, 1, 4096, a));
  std::thread opener([&] {
    std::this_thread::sleep_for(kNegativeWait);
    gate_.Open();
  });
  ASSERT_RT(cudaFree(d));
  EXPECT_TRUE(log_.Has("work")) << "cudaFree returned before earlier work finished";
  opener.join();
  ASSERT_RT(cudaStreamDestroy(a));
}

TEST_F(Runtime, PinnedHostAllocations) {
  void* a = nullptr;
  void* b = nullptr;
  ASSERT_RT(cudaMallocHost(&a, 1 << 20));
  ASSERT_RT(cudaHostAlloc(&b, 1 << 20, cudaHostAllocDefault));
  std::memset(a, 1, 1 << 20);
  std::memset(b, 2, 1 << 20);
  void* d = nullptr;
  ASSERT_RT(cudaMalloc(&d, 1 << 20));
  ASSERT_RT(cudaMemcpy(d, a, 1 << 20, cudaMemcpyHostToDevice));
  ASSERT_RT(cudaMemcpy(b, d, 1 << 20, cudaMemcpyDeviceToHost));
  EXPECT_EQ(static_cast<unsigned char*>(b)[777], 1);
  ASSERT_RT(cudaFree(d));
  ASSERT_RT(cudaFreeHost(a));
  ASSERT_RT(cudaFreeHost(b));
}

TEST_F(Runtime, HostRegisterTwiceIsAlreadyRegistered) {
  size_t bytes = 16 * static_cast<size_t>(sysconf(_SC_PAGESIZE));
  void* p = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  ASSERT_NE(p, MAP_FAILED);
  ASSERT_RT(cudaHostRegister(p, bytes, cudaHostRegisterDefault));
  EXPECT_RT_EQ(cudaErrorHostMemoryAlreadyRegistered,
               cudaHostRegister(p, bytes, cudaHostRegisterDefault));
  ASSERT_RT(cudaHostUnregister(p));
  EXPECT_RT_EQ(cudaErrorHostMemoryNotRegistered, cudaHostUnregister(p));
  munmap(p, bytes);
  (void)cudaGetLastError();
}

void NotAKernel() {}

// A launch takes a stub or a kernel handle: what is neither is a bad handle to the launch
// (the real runtime 13.0, seen on an H200), and an unknown symbol to cudaGetFuncBySymbol.
TEST_F(Runtime, LaunchOfUnregisteredFunctionIsAnInvalidHandle) {
  EXPECT_RT_EQ(cudaErrorInvalidResourceHandle,
               cudaLaunchKernel(reinterpret_cast<const void*>(&NotAKernel), dim3(1), dim3(1),
                                nullptr, 0, nullptr));
  cudaFunction_t f = nullptr;
  EXPECT_RT_EQ(cudaErrorInvalidDeviceFunction,
               cudaGetFuncBySymbol(&f, reinterpret_cast<const void*>(&NotAKernel)));
  (void)cudaGetLastError();
}

}  // namespace
}  // namespace conformance
