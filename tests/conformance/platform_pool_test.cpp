/* cudasim's memory pools where only cudasim can tell: a kernel that touches memory freed with
 * cuMemFreeAsync faults once a synchronisation has given that memory back (release threshold
 * 0), and does not while the pool keeps it; the errors cudasim gives for frees of memory that
 * is not (or no longer) a pool allocation, which the real driver documents only as
 * CUDA_ERROR_INVALID_VALUE among others; and every new entry point through cuGetProcAddress. */
#include <cudasim/cudasim.h>

#include <csignal>
#include <cstdio>

#include "conformance_util.h"

namespace conformance {
namespace {

void pool_touch_stub(unsigned char*) {}
void PoolTouchBody(void** params, dim3, dim3) {
  volatile unsigned char* p = *static_cast<unsigned char**>(params[0]);
  p[0] = 1;
}
const size_t kTouchSizes[] = {sizeof(void*)};
const bool kRegistered = [] {
  cudasimRegisterKernel(reinterpret_cast<const void*>(&pool_touch_stub), "pool_touch_kernel",
                        PoolTouchBody, 1, kTouchSizes);
  return true;
}();

// Allocates from a fresh pool with the given release threshold, frees on the stream,
// synchronises, then launches a kernel that writes the freed memory.
int TouchAfterFree(cuuint64_t threshold) {
  if (!kRegistered || cuInit(0) != CUDA_SUCCESS) return 2;
  CUcontext ctx = nullptr;
  if (cuDevicePrimaryCtxRetain(&ctx, 0) != CUDA_SUCCESS || cuCtxSetCurrent(ctx) != CUDA_SUCCESS)
    return 3;
  CUmemPoolProps props{};
  props.allocType = CU_MEM_ALLOCATION_TYPE_PINNED;
  props.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  CUmemoryPool pool = nullptr;
  if (CUresult r = cuMemPoolCreate(&pool, &props); r != CUDA_SUCCESS) return ChildFail("create", r, 0);
  cuMemPoolSetAttribute(pool, CU_MEMPOOL_ATTR_RELEASE_THRESHOLD, &threshold);
  CUstream s = nullptr;
  cuStreamCreate(&s, CU_STREAM_NON_BLOCKING);
  CUdeviceptr p = 0;
  if (CUresult r = cuMemAllocFromPoolAsync(&p, 1 << 20, pool, s); r != CUDA_SUCCESS)
    return ChildFail("alloc", r, 0);
  cuMemsetD8Async(p, 0, 1 << 20, s);
  cuMemFreeAsync(p, s);
  cuStreamSynchronize(s);
  cudaFunction_t f = nullptr;
  if (cudaGetFuncBySymbol(&f, reinterpret_cast<const void*>(&pool_touch_stub)) != cudaSuccess)
    return 4;
  CUdeviceptr target = p + 100;
  std::fprintf(stderr, "target=0x%llx\n", static_cast<unsigned long long>(target));
  std::fflush(stderr);
  void* args[] = {&target};
  cuLaunchKernel(reinterpret_cast<CUfunction>(f), 1, 1, 1, 1, 1, 1, 0, s, args, nullptr);
  cuStreamSynchronize(s);
  return 0;
}

CONFORMANCE_CHILD(pool_touch_released) { return TouchAfterFree(0); }
CONFORMANCE_CHILD(pool_touch_kept) { return TouchAfterFree(UINT64_MAX); }

TEST(PoolFaults, KernelTouchingFreedAndReleasedMemoryFaults) {
  ChildResult r = RunChild("pool_touch_released");
  EXPECT_EQ(r.signal, SIGABRT) << r.output;
  auto at = r.output.find("target=0x");
  ASSERT_NE(at, std::string::npos) << r.output;
  auto report = r.output.find("cudasim: illegal address", at);
  ASSERT_NE(report, std::string::npos) << r.output;
  EXPECT_NE(r.output.find("pool_touch_kernel", report), std::string::npos) << r.output;
}

TEST(PoolFaults, KernelTouchingFreedMemoryThePoolKeepsDoesNotFault) {
  // Undefined behaviour for a program, but a GPU does not stop on it: the pages are mapped.
  ChildResult r = RunChild("pool_touch_kept");
  EXPECT_TRUE(r.exited) << r.output;
  EXPECT_EQ(r.exit_code, 0) << r.output;
}

class PoolErrors : public DriverTest {};

TEST_F(PoolErrors, FreeAsyncOfMemoryNotFromAPoolOrFreedTwiceIsInvalidValue) {
  CUdeviceptr plain = 0;
  ASSERT_CU(cuMemAlloc(&plain, 4096));
  EXPECT_CU_EQ(CUDA_ERROR_INVALID_VALUE, cuMemFreeAsync(plain, nullptr));
  ASSERT_CU(cuMemFree(plain));
  CUdeviceptr p = 0;
  ASSERT_CU(cuMemAllocAsync(&p, 4096, nullptr));
  ASSERT_CU(cuMemFreeAsync(p, nullptr));
  EXPECT_CU_EQ(CUDA_ERROR_INVALID_VALUE, cuMemFreeAsync(p, nullptr));
  EXPECT_CU_EQ(CUDA_ERROR_INVALID_VALUE, cuMemFree(p)) << "no longer an allocation";
  ASSERT_CU(cuCtxSynchronize());
}

TEST_F(PoolErrors, DestroyedPoolHandleIsInvalidValue) {
  CUmemPoolProps props{};
  props.allocType = CU_MEM_ALLOCATION_TYPE_PINNED;
  props.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  CUmemoryPool pool = nullptr;
  ASSERT_CU(cuMemPoolCreate(&pool, &props));
  ASSERT_CU(cuMemPoolDestroy(pool));
  CUdeviceptr p = 0;
  EXPECT_CU_EQ(CUDA_ERROR_INVALID_VALUE, cuMemAllocFromPoolAsync(&p, 64, pool, nullptr));
  EXPECT_CU_EQ(CUDA_ERROR_INVALID_VALUE, cuMemPoolTrimTo(pool, 0));
  EXPECT_CU_EQ(CUDA_ERROR_INVALID_VALUE, cuMemPoolDestroy(pool));
  EXPECT_CU_EQ(CUDA_ERROR_INVALID_VALUE, cuDeviceSetMemPool(dev_, pool));
  // Exportable pools are not simulated.
  props.handleTypes = CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;
  EXPECT_CU_EQ(CUDA_ERROR_NOT_SUPPORTED, cuMemPoolCreate(&pool, &props));
}

TEST_F(PoolErrors, EveryEntryPointResolvesWithItsPerThreadVariant) {
  struct Name {
    const char* symbol;
    bool perThread;
  };
  const Name names[] = {
      {"cuMemAllocAsync", true}, {"cuMemAllocFromPoolAsync", true}, {"cuMemFreeAsync", true},
      {"cuMemcpy2D", true}, {"cuMemcpy2DAsync", true}, {"cuMemcpy2DUnaligned", true},
      {"cuMemAllocPitch", false}, {"cuMemPoolCreate", false}, {"cuMemPoolDestroy", false},
      {"cuMemPoolSetAttribute", false}, {"cuMemPoolGetAttribute", false},
      {"cuMemPoolTrimTo", false}, {"cuMemPoolSetAccess", false}, {"cuMemPoolGetAccess", false},
      {"cuMemPoolExportToShareableHandle", false}, {"cuMemPoolImportFromShareableHandle", false},
      {"cuMemPoolExportPointer", false}, {"cuMemPoolImportPointer", false},
      {"cuDeviceGetDefaultMemPool", false}, {"cuDeviceGetMemPool", false},
      {"cuDeviceSetMemPool", false},
  };
  for (const Name& name : names) {
    void* legacy = nullptr;
    void* perThread = nullptr;
    CUdriverProcAddressQueryResult status{};
    ASSERT_CU(cuGetProcAddress(name.symbol, &legacy, 13000, CU_GET_PROC_ADDRESS_DEFAULT, &status));
    EXPECT_NE(legacy, nullptr) << name.symbol;
    ASSERT_CU(cuGetProcAddress(name.symbol, &perThread, 13000,
                               CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM, &status));
    EXPECT_NE(perThread, nullptr) << name.symbol;
    if (name.perThread) {
      EXPECT_NE(legacy, perThread) << name.symbol;
    }
  }
}

}  // namespace
}  // namespace conformance
