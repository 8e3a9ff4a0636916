/* cudasim kernels: registration with cudasimRegisterKernel, launch through the runtime
 * (cudaLaunchKernel) and the driver (cuLaunchKernel / cuLaunchKernelEx on the CUfunction
 * from cudaGetFuncBySymbol), both argument forms (kernelParams and the packed `extra`
 * buffer), parameter info, names, stream ordering of kernels, and launch errors. */
#include <cudasim/cudasim.h>

#include <atomic>
#include <cstring>
#include <thread>

#include "conformance_util.h"

namespace conformance {
namespace {

// ---- kernels: a symbol (the stub's address), a body, parameter sizes ----

// fill(unsigned char* dst, int value, size_t n): dst[i] = value for i < n
void fill_stub(unsigned char*, int, size_t) {}
std::atomic<std::thread::id> g_fill_thread;
void FillBody(void** params, dim3, dim3) {
  g_fill_thread = std::this_thread::get_id();
  auto* dst = *static_cast<unsigned char**>(params[0]);
  int value = *static_cast<int*>(params[1]);
  size_t n = *static_cast<size_t*>(params[2]);
  std::memset(dst, value, n);
}
const size_t kFillSizes[] = {sizeof(void*), sizeof(int), sizeof(size_t)};

// gated_fill(Gate*, unsigned char* dst, int value, size_t n): waits for the gate, then fills.
void gated_fill_stub(Gate*, unsigned char*, int, size_t) {}
void GatedFillBody(void** params, dim3, dim3) {
  (*static_cast<Gate**>(params[0]))->Wait();
  auto* dst = *static_cast<unsigned char**>(params[1]);
  std::memset(dst, *static_cast<int*>(params[2]), *static_cast<size_t*>(params[3]));
}
const size_t kGatedFillSizes[] = {sizeof(void*), sizeof(void*), sizeof(int), sizeof(size_t)};

// dims(unsigned* out): out[0..5] = grid.xyz, block.xyz
void dims_stub(unsigned*) {}
void DimsBody(void** params, dim3 grid, dim3 block) {
  auto* out = *static_cast<unsigned**>(params[0]);
  out[0] = grid.x, out[1] = grid.y, out[2] = grid.z;
  out[3] = block.x, out[4] = block.y, out[5] = block.z;
}
const size_t kDimsSizes[] = {sizeof(void*)};

// mixed(int a, double b, char c, short d, char e[12] by value, unsigned char* out):
// writes the values it received to out, to check the packed layout.
struct Twelve {
  char bytes[12];
};
void mixed_stub(int, double, char, short, Twelve, unsigned char*) {}
void MixedBody(void** params, dim3, dim3) {
  auto* out = *static_cast<unsigned char**>(params[5]);
  std::memcpy(out + 0, params[0], 4);
  std::memcpy(out + 8, params[1], 8);
  std::memcpy(out + 16, params[2], 1);
  std::memcpy(out + 18, params[3], 2);
  std::memcpy(out + 20, params[4], 12);
}
const size_t kMixedSizes[] = {4, 8, 1, 2, 12, 8};
// Offsets by the header's rule (aligned to the largest power of two dividing the size,
// capped at 8): 0, 8, 16, 18, 20, 32; 40 bytes in all.
const size_t kMixedOffsets[] = {0, 8, 16, 18, 20, 32};

void replaced_stub(int*) {}
void FirstBody(void** params, dim3, dim3) { **static_cast<int**>(params[0]) = 1; }
void SecondBody(void** params, dim3, dim3) { **static_cast<int**>(params[0]) = 2; }
const size_t kOnePointer[] = {sizeof(void*)};

void never_registered_stub() {}

// Launched only through its kernel handle (KernelHandles, below): nothing else loads it.
void handle_fill_stub(unsigned char*, int, size_t) {}

const bool kRegistered = [] {
  cudasimRegisterKernel(reinterpret_cast<const void*>(&fill_stub), "fill", FillBody, 3, kFillSizes);
  cudasimRegisterKernel(reinterpret_cast<const void*>(&gated_fill_stub), "gated_fill",
                        GatedFillBody, 4, kGatedFillSizes);
  cudasimRegisterKernel(reinterpret_cast<const void*>(&dims_stub), "dims", DimsBody, 1, kDimsSizes);
  cudasimRegisterKernel(reinterpret_cast<const void*>(&mixed_stub), "mixed_kernel", MixedBody, 6,
                        kMixedSizes);
  cudasimRegisterKernel(reinterpret_cast<const void*>(&handle_fill_stub), "handle_fill", FillBody,
                        3, kFillSizes);
  return true;
}();

class Kernels : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_TRUE(kRegistered);
    ASSERT_RT(cudaSetDevice(0));
    ASSERT_RT(cudaMalloc(reinterpret_cast<void**>(&buf_), kBytes));
    ASSERT_RT(cudaMemset(buf_, 0, kBytes));
    ASSERT_RT(cudaDeviceSynchronize());  // a memset may return before it is done
  }
  void TearDown() override {
    gate_.Open();
    EXPECT_FALSE(gate_.timed_out());
    EXPECT_RT(cudaDeviceSynchronize());
    EXPECT_RT(cudaFree(buf_));
  }
  unsigned char Byte(size_t at) {
    unsigned char b = 0;
    EXPECT_RT(cudaMemcpy(&b, buf_ + at, 1, cudaMemcpyDeviceToHost));
    return b;
  }
  CUfunction Func(const void* stub) {
    cudaFunction_t f = nullptr;
    EXPECT_RT(cudaGetFuncBySymbol(&f, stub));
    return reinterpret_cast<CUfunction>(f);
  }
  static constexpr size_t kBytes = 1 << 16;
  unsigned char* buf_ = nullptr;
  Gate gate_;
};

}  // namespace
}  // namespace conformance
extern "C" cudaError_t CUDARTAPI __cudaLaunchKernel(cudaKernel_t kernel, dim3 gridDim,
                                                    dim3 blockDim, void** args, size_t sharedMem,
                                                    cudaStream_t stream);
namespace conformance {
namespace {

// CUDA 13's <<<>>> launches through a kernel handle, as an H200 (driver 580) showed: the handle
// is not the stub, cudaGetFuncBySymbol refuses it, the driver describes it (cuKernelGetParamInfo,
// cuKernelGetName) but has no function for it in the context until a launch loads it (lazy
// loading), and a launch may pass it to cudaLaunchKernel in the stub's place.
TEST_F(Kernels, KernelHandles) {
  cudaKernel_t handle = nullptr;
  ASSERT_RT(cudaGetKernel(&handle, reinterpret_cast<const void*>(&handle_fill_stub)));
  ASSERT_NE(handle, nullptr);
  EXPECT_NE(reinterpret_cast<const void*>(handle),
            reinterpret_cast<const void*>(&handle_fill_stub));
  cudaKernel_t again = nullptr;
  ASSERT_RT(cudaGetKernel(&again, reinterpret_cast<const void*>(&handle_fill_stub)));
  EXPECT_EQ(again, handle);
  cudaFunction_t f = nullptr;
  EXPECT_RT_EQ(cudaErrorInvalidDeviceFunction,
               cudaGetFuncBySymbol(&f, reinterpret_cast<const void*>(handle)));
  EXPECT_RT_EQ(cudaErrorInvalidDeviceFunction, cudaGetLastError());
  const CUkernel kernel = reinterpret_cast<CUkernel>(handle);
  CUfunction function = nullptr;
  EXPECT_CU_EQ(CUDA_ERROR_NOT_FOUND, cuKernelGetFunction(&function, kernel));
  size_t offset = 0, size = 0;
  ASSERT_CU(cuKernelGetParamInfo(kernel, 2, &offset, &size));
  EXPECT_EQ(offset, 16u);
  EXPECT_EQ(size, sizeof(size_t));
  EXPECT_CU_EQ(CUDA_ERROR_INVALID_VALUE, cuKernelGetParamInfo(kernel, 3, &offset, &size));
  const char* name = nullptr;
  ASSERT_CU(cuKernelGetName(&name, kernel));
  EXPECT_STREQ(name, "handle_fill");

  unsigned char* dst = buf_;
  int value = 0x5a;
  size_t n = 100;
  void* args[] = {&dst, &value, &n};
  ASSERT_RT(__cudaLaunchKernel(handle, dim3(1), dim3(1), args, 0, nullptr));
  ASSERT_RT(cudaDeviceSynchronize());
  EXPECT_EQ(Byte(99), 0x5a);
  EXPECT_EQ(Byte(100), 0);
  ASSERT_CU(cuKernelGetFunction(&function, kernel));  // loaded by the launch
  EXPECT_NE(function, nullptr);
  value = 0x33;
  ASSERT_RT(cudaLaunchKernel(reinterpret_cast<const void*>(handle), dim3(1), dim3(1), args, 0,
                             nullptr));
  ASSERT_RT(cudaDeviceSynchronize());
  EXPECT_EQ(Byte(0), 0x33);
}

// Host functions of different streams run one at a time, as the real driver runs them (an H200
// held every stream's host functions behind a blocked one): a marker on another stream waits
// for the blocked host function, and runs once it returns.
TEST_F(Kernels, HostFunctionsOfDifferentStreamsRunOneAtATime) {
  CUstream a = nullptr, b = nullptr;
  ASSERT_CU(cuStreamCreate(&a, CU_STREAM_NON_BLOCKING));
  ASSERT_CU(cuStreamCreate(&b, CU_STREAM_NON_BLOCKING));
  OrderLog log;
  struct Blocking {
    OrderLog* log;
    Gate* gate;
    static void CUDA_CB HostFn(void* self) {
      auto* blocking = static_cast<Blocking*>(self);
      blocking->log->Mark("a");  // running, then held
      blocking->gate->Wait();
    }
  } blocking{&log, &gate_};
  ASSERT_CU(cuLaunchHostFunc(a, Blocking::HostFn, &blocking));
  ASSERT_TRUE(log.WaitFor("a", kPositiveWait));
  Marker marker{&log, "b"};
  ASSERT_CU(cuLaunchHostFunc(b, Marker::HostFn, &marker));
  EXPECT_FALSE(log.WaitFor("b", kNegativeWait)) << "b's host function ran beside a's";
  gate_.Open();
  EXPECT_TRUE(log.WaitFor("b", kPositiveWait));
  ASSERT_CU(cuStreamSynchronize(a));
  ASSERT_CU(cuStreamSynchronize(b));
  ASSERT_CU(cuStreamDestroy(a));
  ASSERT_CU(cuStreamDestroy(b));
}

TEST_F(Kernels, RuntimeLaunchRunsTheBodyWithArguments) {
  unsigned char* dst = buf_;
  int value = 0x42;
  size_t n = 1000;
  void* args[] = {&dst, &value, &n};
  ASSERT_RT(cudaLaunchKernel(reinterpret_cast<const void*>(&fill_stub), dim3(1), dim3(1), args, 0,
                             nullptr));
  ASSERT_RT(cudaDeviceSynchronize());
  EXPECT_EQ(Byte(0), 0x42);
  EXPECT_EQ(Byte(999), 0x42);
  EXPECT_EQ(Byte(1000), 0);
}

TEST_F(Kernels, BodyRunsOnTheStreamWorkerNotTheCaller) {
  unsigned char* dst = buf_;
  int value = 1;
  size_t n = 1;
  void* args[] = {&dst, &value, &n};
  g_fill_thread = std::thread::id();
  ASSERT_RT(cudaLaunchKernel(reinterpret_cast<const void*>(&fill_stub), dim3(1), dim3(1), args, 0,
                             nullptr));
  ASSERT_RT(cudaDeviceSynchronize());
  EXPECT_NE(g_fill_thread.load(), std::this_thread::get_id());
  EXPECT_NE(g_fill_thread.load(), std::thread::id());
}

TEST_F(Kernels, ArgumentsAreCopiedAtLaunch) {
  cudaStream_t s;
  ASSERT_RT(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  ASSERT_RT(cudaLaunchHostFunc(s, Gate::BlockHostFn, &gate_));
  unsigned char* dst = buf_;
  int value = 0x11;
  size_t n = 16;
  void* args[] = {&dst, &value, &n};
  ASSERT_RT(cudaLaunchKernel(reinterpret_cast<const void*>(&fill_stub), dim3(1), dim3(1), args, 0, s));
  value = 0x22;  // after the launch: must not be seen
  dst = nullptr;
  gate_.Open();
  ASSERT_RT(cudaStreamSynchronize(s));
  EXPECT_EQ(Byte(0), 0x11);
  ASSERT_RT(cudaStreamDestroy(s));
}

TEST_F(Kernels, GridAndBlockReachTheBody) {
  unsigned* out = reinterpret_cast<unsigned*>(buf_);
  void* args[] = {&out};
  ASSERT_RT(cudaLaunchKernel(reinterpret_cast<const void*>(&dims_stub), dim3(2, 3, 4), dim3(5, 6, 7),
                             args, 0, nullptr));
  unsigned got[6] = {};
  ASSERT_RT(cudaMemcpy(got, buf_, sizeof got, cudaMemcpyDeviceToHost));
  EXPECT_EQ(got[0], 2u);
  EXPECT_EQ(got[1], 3u);
  EXPECT_EQ(got[2], 4u);
  EXPECT_EQ(got[3], 5u);
  EXPECT_EQ(got[4], 6u);
  EXPECT_EQ(got[5], 7u);
}

TEST_F(Kernels, DriverLaunchWithKernelParams) {
  CUfunction f = Func(reinterpret_cast<const void*>(&fill_stub));
  ASSERT_NE(f, nullptr);
  CUdeviceptr dst = reinterpret_cast<CUdeviceptr>(buf_);
  int value = 0x5c;
  size_t n = 64;
  void* args[] = {&dst, &value, &n};
  ASSERT_CU(cuLaunchKernel(f, 1, 1, 1, 1, 1, 1, 0, nullptr, args, nullptr));
  ASSERT_CU(cuCtxSynchronize());
  EXPECT_EQ(Byte(63), 0x5c);
  EXPECT_EQ(Byte(64), 0);
}

TEST_F(Kernels, DriverLaunchWithPackedExtraBuffer) {
  CUfunction f = Func(reinterpret_cast<const void*>(&mixed_stub));
  unsigned char packed[40] = {};
  int a = 0x01020304;
  double b = 2.5;
  char c = 'c';
  short d = 0x0506;
  Twelve e;
  for (int i = 0; i < 12; ++i) e.bytes[i] = static_cast<char>(0x70 + i);
  unsigned char* out = buf_;
  std::memcpy(packed + kMixedOffsets[0], &a, 4);
  std::memcpy(packed + kMixedOffsets[1], &b, 8);
  std::memcpy(packed + kMixedOffsets[2], &c, 1);
  std::memcpy(packed + kMixedOffsets[3], &d, 2);
  std::memcpy(packed + kMixedOffsets[4], &e, 12);
  std::memcpy(packed + kMixedOffsets[5], &out, 8);
  size_t size = sizeof packed;
  void* extra[] = {CU_LAUNCH_PARAM_BUFFER_POINTER, packed, CU_LAUNCH_PARAM_BUFFER_SIZE, &size,
                   CU_LAUNCH_PARAM_END};
  ASSERT_CU(cuLaunchKernel(f, 1, 1, 1, 1, 1, 1, 0, nullptr, nullptr, extra));
  ASSERT_CU(cuCtxSynchronize());
  unsigned char got[32] = {};
  ASSERT_RT(cudaMemcpy(got, buf_, sizeof got, cudaMemcpyDeviceToHost));
  EXPECT_EQ(std::memcmp(got + 0, &a, 4), 0);
  EXPECT_EQ(std::memcmp(got + 8, &b, 8), 0);
  EXPECT_EQ(got[16], 'c');
  EXPECT_EQ(std::memcmp(got + 18, &d, 2), 0);
  EXPECT_EQ(std::memcmp(got + 20, &e, 12), 0);
}

TEST_F(Kernels, DriverLaunchExWithKernelParams) {
  CUfunction f = Func(reinterpret_cast<const void*>(&fill_stub));
  CUdeviceptr dst = reinterpret_cast<CUdeviceptr>(buf_);
  int value = 0x6d;
  size_t n = 8;
  void* args[] = {&dst, &value, &n};
  CUlaunchConfig cfg{};
  cfg.gridDimX = cfg.gridDimY = cfg.gridDimZ = 1;
  cfg.blockDimX = cfg.blockDimY = cfg.blockDimZ = 1;
  cfg.hStream = nullptr;
  ASSERT_CU(cuLaunchKernelEx(&cfg, f, args, nullptr));
  ASSERT_CU(cuCtxSynchronize());
  EXPECT_EQ(Byte(7), 0x6d);
}

TEST_F(Kernels, ParamInfoFollowsRegisteredSizes) {
  CUfunction f = Func(reinterpret_cast<const void*>(&mixed_stub));
  for (size_t i = 0; i < 6; ++i) {
    size_t offset = 99, size = 99;
    ASSERT_CU(cuFuncGetParamInfo(f, i, &offset, &size)) << "param " << i;
    EXPECT_EQ(offset, kMixedOffsets[i]) << "param " << i;
    EXPECT_EQ(size, kMixedSizes[i]) << "param " << i;
  }
  size_t offset, size;
  EXPECT_CU_EQ(CUDA_ERROR_INVALID_VALUE, cuFuncGetParamInfo(f, 6, &offset, &size));
}

// CUDASIM_FAULTS=paraminfo-fail[=TEXT]: no kernel's parameters can be read, or only those of
// kernels whose name contains TEXT (some kernels of a job opaque to a tool, the rest not).
TEST_F(Kernels, ParamInfoFaultForEveryKernelOrByName) {
  CUfunction fill = Func(reinterpret_cast<const void*>(&fill_stub));
  CUfunction mixed = Func(reinterpret_cast<const void*>(&mixed_stub));
  size_t offset = 0, size = 0;
  ASSERT_EQ(cudasimSetFaults("paraminfo-fail=mixed"), nullptr);
  EXPECT_CU_EQ(CUDA_ERROR_NOT_SUPPORTED, cuFuncGetParamInfo(mixed, 0, &offset, &size));
  EXPECT_CU(cuFuncGetParamInfo(fill, 0, &offset, &size));
  EXPECT_NE(cudasimSetFaults("paraminfo-fail="), nullptr);  // refused: the plan stays
  EXPECT_CU_EQ(CUDA_ERROR_NOT_SUPPORTED, cuFuncGetParamInfo(mixed, 0, &offset, &size));
  ASSERT_EQ(cudasimSetFaults("paraminfo-fail"), nullptr);
  EXPECT_CU_EQ(CUDA_ERROR_NOT_SUPPORTED, cuFuncGetParamInfo(fill, 0, &offset, &size));
  EXPECT_CU_EQ(CUDA_ERROR_NOT_SUPPORTED, cuFuncGetParamInfo(mixed, 0, &offset, &size));
  ASSERT_EQ(cudasimSetFaults(""), nullptr);
  EXPECT_CU(cuFuncGetParamInfo(fill, 0, &offset, &size));
  EXPECT_CU(cuFuncGetParamInfo(mixed, 0, &offset, &size));
}

TEST_F(Kernels, RuntimeParamInfo) {
  size_t offset = 0, size = 0;
  ASSERT_RT(cudaFuncGetParamInfo(reinterpret_cast<const void*>(&mixed_stub), 4, &offset, &size));
  EXPECT_EQ(offset, 20u);
  EXPECT_EQ(size, 12u);
  EXPECT_RT_EQ(cudaErrorInvalidValue,
               cudaFuncGetParamInfo(reinterpret_cast<const void*>(&mixed_stub), 6, &offset, &size));
  (void)cudaGetLastError();
}

TEST_F(Kernels, FuncGetNameIsTheRegisteredName) {
  const char* name = nullptr;
  ASSERT_CU(cuFuncGetName(&name, Func(reinterpret_cast<const void*>(&mixed_stub))));
  EXPECT_STREQ(name, "mixed_kernel");
}

TEST_F(Kernels, FuncBySymbolIsStable) {
  EXPECT_EQ(Func(reinterpret_cast<const void*>(&fill_stub)),
            Func(reinterpret_cast<const void*>(&fill_stub)));
  EXPECT_NE(Func(reinterpret_cast<const void*>(&fill_stub)),
            Func(reinterpret_cast<const void*>(&dims_stub)));
}

TEST_F(Kernels, ReRegisteringReplacesTheBody) {
  cudasimRegisterKernel(reinterpret_cast<const void*>(&replaced_stub), "replaced", FirstBody, 1,
                        kOnePointer);
  int* out = reinterpret_cast<int*>(buf_);
  void* args[] = {&out};
  ASSERT_RT(cudaLaunchKernel(reinterpret_cast<const void*>(&replaced_stub), dim3(1), dim3(1), args,
                             0, nullptr));
  int v = 0;
  ASSERT_RT(cudaMemcpy(&v, buf_, 4, cudaMemcpyDeviceToHost));
  EXPECT_EQ(v, 1);
  cudasimRegisterKernel(reinterpret_cast<const void*>(&replaced_stub), "replaced", SecondBody, 1,
                        kOnePointer);
  ASSERT_RT(cudaLaunchKernel(reinterpret_cast<const void*>(&replaced_stub), dim3(1), dim3(1), args,
                             0, nullptr));
  ASSERT_RT(cudaMemcpy(&v, buf_, 4, cudaMemcpyDeviceToHost));
  EXPECT_EQ(v, 2);
}

// As the real runtime (portable_runtime_test's LaunchOfUnregisteredFunctionIsAnInvalidHandle):
// a launch of an unknown pointer is a bad handle, cudaGetFuncBySymbol of it an unknown function.
TEST_F(Kernels, UnregisteredSymbolIsInvalidDeviceFunction) {
  EXPECT_RT_EQ(cudaErrorInvalidResourceHandle,
               cudaLaunchKernel(reinterpret_cast<const void*>(&never_registered_stub), dim3(1),
                                dim3(1), nullptr, 0, nullptr));
  EXPECT_RT_EQ(cudaErrorInvalidResourceHandle, cudaGetLastError());
  cudaFunction_t f = nullptr;
  EXPECT_RT_EQ(cudaErrorInvalidDeviceFunction,
               cudaGetFuncBySymbol(&f, reinterpret_cast<const void*>(&never_registered_stub)));
  (void)cudaGetLastError();
}

TEST_F(Kernels, UnknownCUfunctionIsInvalidHandle) {
  int not_a_function = 0;
  EXPECT_CU_EQ(CUDA_ERROR_INVALID_HANDLE,
               cuLaunchKernel(reinterpret_cast<CUfunction>(&not_a_function), 1, 1, 1, 1, 1, 1, 0,
                              nullptr, nullptr, nullptr));
  EXPECT_CU_EQ(CUDA_ERROR_INVALID_HANDLE,
               cuLaunchKernel(nullptr, 1, 1, 1, 1, 1, 1, 0, nullptr, nullptr, nullptr));
}

TEST_F(Kernels, KernelRunsLateInStreamOrder) {
  cudaStream_t s;
  ASSERT_RT(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  Gate* g = &gate_;
  unsigned char* dst = buf_;
  int value = 0x99;
  size_t n = kBytes;
  void* args[] = {&g, &dst, &value, &n};
  ASSERT_RT(cudaLaunchKernel(reinterpret_cast<const void*>(&gated_fill_stub), dim3(1), dim3(1),
                             args, 0, s));
  ASSERT_RT(cudaMemsetAsync(buf_, 0x01, 1, s));  // after the kernel in stream order
  EXPECT_RT_EQ(cudaErrorNotReady, cudaStreamQuery(s));
  gate_.Open();
  ASSERT_RT(cudaStreamSynchronize(s));
  EXPECT_EQ(Byte(0), 0x01);
  EXPECT_EQ(Byte(1), 0x99);
  ASSERT_RT(cudaStreamDestroy(s));
}

TEST_F(Kernels, MissingWaitShowsAsWrongDataAndEventWaitFixesIt) {
  // A slow kernel on stream a writes the buffer; stream b copies it out.
  cudaStream_t a, b;
  ASSERT_RT(cudaStreamCreateWithFlags(&a, cudaStreamNonBlocking));
  ASSERT_RT(cudaStreamCreateWithFlags(&b, cudaStreamNonBlocking));
  unsigned char* host = nullptr;
  ASSERT_RT(cudaMallocHost(reinterpret_cast<void**>(&host), kBytes));
  Gate* g = &gate_;
  unsigned char* dst = buf_;
  int value = 0x77;
  size_t n = kBytes;
  void* args[] = {&g, &dst, &value, &n};

  // Without a wait: b's copy runs while the kernel is still blocked.
  ASSERT_RT(cudaLaunchKernel(reinterpret_cast<const void*>(&gated_fill_stub), dim3(1), dim3(1),
                             args, 0, a));
  ASSERT_RT(cudaMemcpyAsync(host, buf_, kBytes, cudaMemcpyDeviceToHost, b));
  ASSERT_RT(cudaStreamSynchronize(b));
  EXPECT_EQ(host[0], 0x00) << "the copy waited for a kernel it had no dependency on";
  gate_.Open();
  ASSERT_RT(cudaStreamSynchronize(a));

  // With an event wait: the copy sees the kernel's writes.
  Gate gate2;
  g = &gate2;
  value = 0x88;
  cudaEvent_t ev;
  ASSERT_RT(cudaEventCreateWithFlags(&ev, cudaEventDisableTiming));
  ASSERT_RT(cudaLaunchKernel(reinterpret_cast<const void*>(&gated_fill_stub), dim3(1), dim3(1),
                             args, 0, a));
  ASSERT_RT(cudaEventRecord(ev, a));
  ASSERT_RT(cudaStreamWaitEvent(b, ev, 0));
  ASSERT_RT(cudaMemcpyAsync(host, buf_, kBytes, cudaMemcpyDeviceToHost, b));
  gate2.Open();
  ASSERT_RT(cudaStreamSynchronize(b));
  EXPECT_EQ(host[0], 0x88);
  EXPECT_EQ(host[kBytes - 1], 0x88);
  EXPECT_FALSE(gate2.timed_out());
  ASSERT_RT(cudaEventDestroy(ev));
  ASSERT_RT(cudaStreamDestroy(a));
  ASSERT_RT(cudaStreamDestroy(b));
  ASSERT_RT(cudaFreeHost(host));
}

TEST_F(Kernels, LegacyStreamKernelWaitsForBlockingStreamWork) {
  cudaStream_t a;
  ASSERT_RT(cudaStreamCreate(&a));  // blocking
  ASSERT_RT(cudaLaunchHostFunc(a, Gate::BlockHostFn, &gate_));
  ASSERT_RT(cudaMemsetAsync(buf_, 0x10, 1, a));
  unsigned char* dst = buf_;
  int value = 0x20;
  size_t n = 1;
  void* args[] = {&dst, &value, &n};
  ASSERT_RT(cudaLaunchKernel(reinterpret_cast<const void*>(&fill_stub), dim3(1), dim3(1), args, 0,
                             nullptr));
  gate_.Open();
  ASSERT_RT(cudaDeviceSynchronize());
  EXPECT_EQ(Byte(0), 0x20) << "the legacy-stream kernel ran before the blocking stream's memset";
  ASSERT_RT(cudaStreamDestroy(a));
}

}  // namespace
}  // namespace conformance
