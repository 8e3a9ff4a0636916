/* Driver basics: initialisation, devices, the primary context, entry-point lookup through
 * cuGetProcAddress (both versions) and error strings. Real CUDA API only. */
#include <cudaTypedefs.h>
#include <dlfcn.h>

#include <cstring>

#include "conformance_util.h"

namespace conformance {
namespace {

// ---- before cuInit (fresh process) ----

CONFORMANCE_CHILD(before_init) {
  int version = 0;
  // cuDriverGetVersion needs no initialisation.
  if (CUresult r = cuDriverGetVersion(&version); r != CUDA_SUCCESS)
    return ChildFail("cuDriverGetVersion before cuInit", r, CUDA_SUCCESS);
  int count = -1;
  if (CUresult r = cuDeviceGetCount(&count); r != CUDA_ERROR_NOT_INITIALIZED)
    return ChildFail("cuDeviceGetCount before cuInit", r, CUDA_ERROR_NOT_INITIALIZED);
  CUdevice dev;
  if (CUresult r = cuDeviceGet(&dev, 0); r != CUDA_ERROR_NOT_INITIALIZED)
    return ChildFail("cuDeviceGet before cuInit", r, CUDA_ERROR_NOT_INITIALIZED);
  CUdeviceptr p;
  if (CUresult r = cuMemAlloc(&p, 1024); r != CUDA_ERROR_NOT_INITIALIZED)
    return ChildFail("cuMemAlloc before cuInit", r, CUDA_ERROR_NOT_INITIALIZED);
  CUstream s;
  if (CUresult r = cuStreamCreate(&s, 0); r != CUDA_ERROR_NOT_INITIALIZED)
    return ChildFail("cuStreamCreate before cuInit", r, CUDA_ERROR_NOT_INITIALIZED);
  // Flags must be 0.
  if (CUresult r = cuInit(1); r != CUDA_ERROR_INVALID_VALUE)
    return ChildFail("cuInit(1)", r, CUDA_ERROR_INVALID_VALUE);
  if (CUresult r = cuInit(0); r != CUDA_SUCCESS) return ChildFail("cuInit(0)", r, CUDA_SUCCESS);
  if (CUresult r = cuDeviceGetCount(&count); r != CUDA_SUCCESS)
    return ChildFail("cuDeviceGetCount after cuInit", r, CUDA_SUCCESS);
  return 0;
}

TEST(DriverInit, CallsBeforeCuInitReturnNotInitialized) {
  ChildResult r = RunChild("before_init");
  EXPECT_TRUE(r.exited && r.exit_code == 0) << r.output;
}

// No context is ever made current in this process: context-bound calls must say so.
CONFORMANCE_CHILD(no_context) {
  if (CUresult r = cuInit(0); r != CUDA_SUCCESS) return ChildFail("cuInit", r, 0);
  CUcontext cur = reinterpret_cast<CUcontext>(1);
  if (CUresult r = cuCtxGetCurrent(&cur); r != CUDA_SUCCESS || cur != nullptr)
    return ChildFail("cuCtxGetCurrent without context", r, CUDA_SUCCESS);
  CUdeviceptr p;
  if (CUresult r = cuMemAlloc(&p, 1024); r != CUDA_ERROR_INVALID_CONTEXT)
    return ChildFail("cuMemAlloc without context", r, CUDA_ERROR_INVALID_CONTEXT);
  CUstream s;
  if (CUresult r = cuStreamCreate(&s, 0); r != CUDA_ERROR_INVALID_CONTEXT)
    return ChildFail("cuStreamCreate without context", r, CUDA_ERROR_INVALID_CONTEXT);
  CUevent e;
  if (CUresult r = cuEventCreate(&e, 0); r != CUDA_ERROR_INVALID_CONTEXT)
    return ChildFail("cuEventCreate without context", r, CUDA_ERROR_INVALID_CONTEXT);
  size_t free_b, total_b;
  if (CUresult r = cuMemGetInfo(&free_b, &total_b); r != CUDA_ERROR_INVALID_CONTEXT)
    return ChildFail("cuMemGetInfo without context", r, CUDA_ERROR_INVALID_CONTEXT);
  if (CUresult r = cuCtxSynchronize(); r != CUDA_ERROR_INVALID_CONTEXT)
    return ChildFail("cuCtxSynchronize without context", r, CUDA_ERROR_INVALID_CONTEXT);
  return 0;
}

TEST(DriverContext, CallsWithoutCurrentContextReturnInvalidContext) {
  ChildResult r = RunChild("no_context");
  EXPECT_TRUE(r.exited && r.exit_code == 0) << r.output;
}

// ---- devices ----

TEST(DriverDevice, VersionAndDeviceQueries) {
  ASSERT_CU(cuInit(0));
  int version = 0;
  ASSERT_CU(cuDriverGetVersion(&version));
  EXPECT_GE(version, 13000);
  int count = 0;
  ASSERT_CU(cuDeviceGetCount(&count));
  ASSERT_GE(count, 1);
  CUdevice dev = -1;
  ASSERT_CU(cuDeviceGet(&dev, 0));
  char name[256] = {};
  ASSERT_CU(cuDeviceGetName(name, sizeof name, dev));
  EXPECT_GT(std::strlen(name), 0u);
  size_t total = 0;
  ASSERT_CU(cuDeviceTotalMem(&total, dev));
  EXPECT_GT(total, 0u);
  int major = 0;
  ASSERT_CU(cuDeviceGetAttribute(&major, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR, dev));
  EXPECT_GE(major, 1);
}

TEST(DriverDevice, OrdinalPastLastDeviceIsInvalidDevice) {
  ASSERT_CU(cuInit(0));
  int count = 0;
  ASSERT_CU(cuDeviceGetCount(&count));
  CUdevice dev;
  EXPECT_CU_EQ(CUDA_ERROR_INVALID_DEVICE, cuDeviceGet(&dev, count));
  EXPECT_CU_EQ(CUDA_ERROR_INVALID_DEVICE, cuDeviceGet(&dev, -1));
}

// ---- primary context ----

TEST(DriverContext, PrimaryContextRetainIsSharedAndCounted) {
  ASSERT_CU(cuInit(0));
  CUdevice dev;
  ASSERT_CU(cuDeviceGet(&dev, 0));
  CUcontext a = nullptr, b = nullptr;
  ASSERT_CU(cuDevicePrimaryCtxRetain(&a, dev));
  ASSERT_CU(cuDevicePrimaryCtxRetain(&b, dev));
  EXPECT_NE(a, nullptr);
  EXPECT_EQ(a, b);
  unsigned int flags = 0;
  int active = 0;
  ASSERT_CU(cuDevicePrimaryCtxGetState(dev, &flags, &active));
  EXPECT_EQ(active, 1);
  ASSERT_CU(cuCtxSetCurrent(a));
  CUcontext cur = nullptr;
  ASSERT_CU(cuCtxGetCurrent(&cur));
  EXPECT_EQ(cur, a);
  CUdevice ctx_dev = -1;
  ASSERT_CU(cuCtxGetDevice(&ctx_dev));
  EXPECT_EQ(ctx_dev, dev);
  ASSERT_CU(cuCtxSetCurrent(nullptr));
  EXPECT_CU(cuDevicePrimaryCtxRelease(dev));
  EXPECT_CU(cuDevicePrimaryCtxRelease(dev));
}

TEST(DriverContext, CurrentContextIsPerThread) {
  ASSERT_CU(cuInit(0));
  CUdevice dev;
  ASSERT_CU(cuDeviceGet(&dev, 0));
  CUcontext ctx = nullptr;
  ASSERT_CU(cuDevicePrimaryCtxRetain(&ctx, dev));
  ASSERT_CU(cuCtxSetCurrent(ctx));
  CUcontext seen = reinterpret_cast<CUcontext>(1);
  CUresult r = CUDA_ERROR_UNKNOWN;
  std::thread t([&] { r = cuCtxGetCurrent(&seen); });
  t.join();
  EXPECT_CU_EQ(CUDA_SUCCESS, r);
  EXPECT_EQ(seen, nullptr);
  ASSERT_CU(cuCtxSetCurrent(nullptr));
  EXPECT_CU(cuDevicePrimaryCtxRelease(dev));
}

TEST_F(DriverTest, UnsetContextMakesAllocationFailWithInvalidContext) {
  ASSERT_CU(cuCtxSetCurrent(nullptr));
  CUdeviceptr p;
  EXPECT_CU_EQ(CUDA_ERROR_INVALID_CONTEXT, cuMemAlloc(&p, 4096));
  ASSERT_CU(cuCtxSetCurrent(ctx_));
}

// ---- cuGetProcAddress ----

TEST_F(DriverTest, GetProcAddressFindsVersionedFunctionsThatWork) {
  void* alloc = nullptr;
  void* free_fn = nullptr;
  CUdriverProcAddressQueryResult status = CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND;
  ASSERT_CU(cuGetProcAddress("cuMemAlloc", &alloc, 13000, CU_GET_PROC_ADDRESS_DEFAULT, &status));
  EXPECT_EQ(status, CU_GET_PROC_ADDRESS_SUCCESS);
  ASSERT_NE(alloc, nullptr);
  ASSERT_CU(cuGetProcAddress("cuMemFree", &free_fn, 13000, CU_GET_PROC_ADDRESS_DEFAULT, &status));
  EXPECT_EQ(status, CU_GET_PROC_ADDRESS_SUCCESS);
  ASSERT_NE(free_fn, nullptr);
  // The pointers are the _v2 entry points (64-bit sizes): use them through their typedefs.
  CUdeviceptr p = 0;
  ASSERT_CU(reinterpret_cast<PFN_cuMemAlloc_v3020>(alloc)(&p, 1 << 20));
  EXPECT_NE(p, 0u);
  ASSERT_CU(reinterpret_cast<PFN_cuMemFree_v3020>(free_fn)(p));
}

TEST_F(DriverTest, GetProcAddressAnswersForTheRequiredFunctions) {
  const char* names[] = {
      "cuInit", "cuDriverGetVersion", "cuDeviceGet", "cuDeviceGetCount",
      "cuDevicePrimaryCtxRetain", "cuDevicePrimaryCtxRelease", "cuCtxGetCurrent",
      "cuCtxSetCurrent", "cuCtxSynchronize", "cuGetProcAddress", "cuMemAlloc", "cuMemFree",
      "cuMemGetInfo", "cuMemGetAllocationGranularity", "cuMemAddressReserve",
      "cuMemAddressFree", "cuMemCreate", "cuMemRelease", "cuMemMap", "cuMemUnmap",
      "cuMemSetAccess", "cuMemHostAlloc", "cuMemFreeHost", "cuMemHostRegister",
      "cuMemHostUnregister", "cuMemcpy", "cuMemcpyAsync", "cuMemcpyHtoD", "cuMemcpyDtoH",
      "cuMemcpyDtoD", "cuMemcpyHtoDAsync", "cuMemcpyDtoHAsync", "cuMemcpyDtoDAsync",
      "cuMemsetD8", "cuMemsetD32", "cuMemsetD8Async", "cuMemsetD32Async", "cuStreamCreate",
      "cuStreamDestroy", "cuStreamSynchronize", "cuStreamQuery", "cuStreamWaitEvent",
      "cuEventCreate", "cuEventDestroy", "cuEventRecord", "cuEventQuery", "cuEventSynchronize",
      "cuEventElapsedTime", "cuLaunchKernel", "cuLaunchKernelEx", "cuFuncGetParamInfo",
      "cuFuncGetName", "cuGetErrorString", "cuGetErrorName", "cuLaunchHostFunc",
      "cuIpcGetMemHandle", "cuIpcOpenMemHandle", "cuIpcCloseMemHandle",
      "cuMemExportToShareableHandle", "cuMemImportFromShareableHandle"};
  for (const char* name : names) {
    void* fn = nullptr;
    CUdriverProcAddressQueryResult status = CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND;
    EXPECT_CU(cuGetProcAddress(name, &fn, 13000, CU_GET_PROC_ADDRESS_DEFAULT, &status))
        << name;
    EXPECT_EQ(status, CU_GET_PROC_ADDRESS_SUCCESS) << name;
    EXPECT_NE(fn, nullptr) << name;
  }
}

TEST_F(DriverTest, GetProcAddressUnknownSymbolGivesNullAndNotFound) {
  void* fn = reinterpret_cast<void*>(1);
  CUdriverProcAddressQueryResult status = CU_GET_PROC_ADDRESS_SUCCESS;
  // The header documents CUDA_SUCCESS with a NULL pointer for an invalid symbol.
  EXPECT_CU(cuGetProcAddress("cuNoSuchFunction", &fn, 13000, CU_GET_PROC_ADDRESS_DEFAULT,
                             &status));
  EXPECT_EQ(fn, nullptr);
  EXPECT_EQ(status, CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND);
}

TEST_F(DriverTest, GetProcAddressTooOldVersionIsVersionNotSufficient) {
  void* fn = reinterpret_cast<void*>(1);
  CUdriverProcAddressQueryResult status = CU_GET_PROC_ADDRESS_SUCCESS;
  // cuMemCreate arrived in CUDA 10.2.
  EXPECT_CU(cuGetProcAddress("cuMemCreate", &fn, 10000, CU_GET_PROC_ADDRESS_DEFAULT, &status));
  EXPECT_EQ(fn, nullptr);
  EXPECT_EQ(status, CU_GET_PROC_ADDRESS_VERSION_NOT_SUFFICIENT);
}

TEST_F(DriverTest, GetProcAddressVersionAboveDriverIsInvalidValue) {
  int version = 0;
  ASSERT_CU(cuDriverGetVersion(&version));
  void* fn = nullptr;
  CUdriverProcAddressQueryResult status;
  EXPECT_CU_EQ(CUDA_ERROR_INVALID_VALUE,
               cuGetProcAddress("cuMemAlloc", &fn, version + 1000, CU_GET_PROC_ADDRESS_DEFAULT,
                                &status));
}

TEST_F(DriverTest, GetProcAddressPerThreadFlagGivesPerThreadVariant) {
  void* legacy = nullptr;
  void* per_thread = nullptr;
  ASSERT_CU(cuGetProcAddress("cuMemcpyHtoDAsync", &legacy, 13000,
                             CU_GET_PROC_ADDRESS_LEGACY_STREAM, nullptr));
  ASSERT_CU(cuGetProcAddress("cuMemcpyHtoDAsync", &per_thread, 13000,
                             CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM, nullptr));
  ASSERT_NE(legacy, nullptr);
  ASSERT_NE(per_thread, nullptr);
  EXPECT_NE(legacy, per_thread);
  // A function without a per-thread variant comes back as its legacy version.
  void* a = nullptr;
  void* b = nullptr;
  ASSERT_CU(cuGetProcAddress("cuMemAlloc", &a, 13000, CU_GET_PROC_ADDRESS_LEGACY_STREAM, nullptr));
  ASSERT_CU(cuGetProcAddress("cuMemAlloc", &b, 13000,
                             CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM, nullptr));
  EXPECT_EQ(a, b);
}

TEST_F(DriverTest, LegacyGetProcAddressWithoutStatusWorks) {
  // The CUDA 11.3 entry point, exported as "cuGetProcAddress" (no status argument).
  auto v1 = reinterpret_cast<PFN_cuGetProcAddress_v11030>(dlsym(RTLD_DEFAULT, "cuGetProcAddress"));
  ASSERT_NE(v1, nullptr) << "libcuda.so.1 does not export cuGetProcAddress";
  void* fn = nullptr;
  ASSERT_CU(v1("cuMemGetInfo", &fn, 13000, CU_GET_PROC_ADDRESS_DEFAULT));
  ASSERT_NE(fn, nullptr);
  size_t free_b = 0, total_b = 0;
  ASSERT_CU(reinterpret_cast<PFN_cuMemGetInfo_v3020>(fn)(&free_b, &total_b));
  EXPECT_GT(total_b, 0u);
  EXPECT_LE(free_b, total_b);
}

// ---- error strings ----

TEST(DriverErrors, ErrorStringAndNameForKnownCodes) {
  const char* s = nullptr;
  ASSERT_CU(cuGetErrorName(CUDA_ERROR_OUT_OF_MEMORY, &s));
  EXPECT_STREQ(s, "CUDA_ERROR_OUT_OF_MEMORY");
  ASSERT_CU(cuGetErrorName(CUDA_SUCCESS, &s));
  EXPECT_STREQ(s, "CUDA_SUCCESS");
  ASSERT_CU(cuGetErrorName(CUDA_ERROR_INVALID_VALUE, &s));
  EXPECT_STREQ(s, "CUDA_ERROR_INVALID_VALUE");
  ASSERT_CU(cuGetErrorName(CUDA_ERROR_NOT_READY, &s));
  EXPECT_STREQ(s, "CUDA_ERROR_NOT_READY");
  ASSERT_CU(cuGetErrorString(CUDA_ERROR_OUT_OF_MEMORY, &s));
  EXPECT_STREQ(s, "out of memory");
  ASSERT_CU(cuGetErrorString(CUDA_ERROR_INVALID_VALUE, &s));
  EXPECT_STREQ(s, "invalid argument");
  ASSERT_CU(cuGetErrorString(CUDA_SUCCESS, &s));
  EXPECT_STREQ(s, "no error");
}

TEST(DriverErrors, UnknownCodeIsInvalidValueWithNullString) {
  const char* s = "x";
  EXPECT_CU_EQ(CUDA_ERROR_INVALID_VALUE, cuGetErrorName(static_cast<CUresult>(12345), &s));
  EXPECT_EQ(s, nullptr);
  s = "x";
  EXPECT_CU_EQ(CUDA_ERROR_INVALID_VALUE, cuGetErrorString(static_cast<CUresult>(12345), &s));
  EXPECT_EQ(s, nullptr);
}

}  // namespace
}  // namespace conformance
