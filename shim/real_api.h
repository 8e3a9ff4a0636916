// The real functions behind the interposed ones: glibc's dlsym, the driver's entry points
// (fetched through the driver's own cuGetProcAddress, never through our wrappers), and the
// few runtime functions the shim needs. Each is resolved once.
#pragma once

#include <dlfcn.h>

#include <cuda.h>
#include <cuda_runtime_api.h>

#include "shim/alloc_path_symbols.h"

namespace delta::shim {

// glibc's dlsym, found with dlvsym so that our exported dlsym does not find itself.
using DlsymFunction = void* (*)(void*, const char*);
DlsymFunction realDlsym();

// The next definition of `name` after libdelta.so, looked up once and cached in `cache` (relaxed
// atomics: several threads may fill it, with the same value).
template <class F>
F nextFunction(F& cache, const char* name) {
  F function = __atomic_load_n(&cache, __ATOMIC_RELAXED);
  if (function == nullptr) {
    function = reinterpret_cast<F>(realDlsym()(RTLD_NEXT, name));
    __atomic_store_n(&cache, function, __ATOMIC_RELAXED);
  }
  return function;
}

#define DELTA_DRIVER_FUNCTIONS(X)                                                         \
  X(cuInit) X(cuGetProcAddress_v2) X(cuGetErrorString) X(cuCtxGetCurrent) X(cuCtxSetCurrent) \
  X(cuDeviceGet) X(cuDeviceGetName) X(cuDeviceTotalMem_v2) X(cuMemAlloc_v2) X(cuMemFree_v2) \
  X(cuMemGetInfo_v2) X(cuMemGetAllocationGranularity) X(cuMemAddressReserve)              \
  X(cuMemAddressFree) X(cuMemCreate) X(cuMemRelease) X(cuMemMap) X(cuMemUnmap)            \
  X(cuMemSetAccess) X(cuMemHostAlloc) X(cuMemFreeHost) X(cuMemcpyHtoDAsync_v2)            \
  X(cuMemcpyDtoHAsync_v2) X(cuStreamCreate) X(cuStreamWaitEvent) X(cuStreamSynchronize)   \
  X(cuEventCreate) X(cuEventRecord) X(cuEventQuery) X(cuEventSynchronize)                 \
  X(cuEventDestroy_v2) X(cuFuncGetParamInfo) X(cuFuncGetName) X(cuIpcGetMemHandle)         \
  X(cuKernelGetParamInfo) X(cuKernelGetName)                                               \
  X(cuCtxSynchronize) X(cuLaunchKernel) X(cuMemExportToShareableHandle)                   \
  X(cuMemImportFromShareableHandle) X(cuMemcpyDtoDAsync_v2) X(cuIpcOpenMemHandle_v2)        \
  X(cuIpcCloseMemHandle) X(cuEventElapsedTime_v2) X(cuMemGetAddressRange_v2)                 \
  X(cuPointerGetAttribute) X(cuMemGetAllocationPropertiesFromHandle)                        \
  X(cuMemRetainAllocationHandle)

struct DriverApi {
#define DELTA_DECLARE(name) decltype(&::name) name = nullptr;
  DELTA_DRIVER_FUNCTIONS(DELTA_DECLARE)
#undef DELTA_DECLARE
};

// Loads libcuda.so.1 (already loaded by the program's runtime, normally) and fetches every
// function above. False when there is no driver or it lacks one of them: the shim then stays
// out of the way and the program sees exactly what it would see without it.
bool loadDriver(DriverApi& api);

// The program's runtime functions the shim calls through (RTLD_NEXT: the next definition
// after libdelta.so, i.e. libcudart's).
struct RuntimeApi {
  // Spelled out: with cuda_runtime.h (which nccl.h includes) these names are overloaded.
  cudaError_t (*cudaMalloc)(void**, size_t) = nullptr;
  cudaError_t (*cudaFree)(void*) = nullptr;
  cudaError_t (*cudaMemGetInfo)(size_t*, size_t*) = nullptr;
  cudaError_t (*cudaGetFuncBySymbol)(cudaFunction_t*, const void*) = nullptr;
  cudaError_t (*cudaIpcGetMemHandle)(cudaIpcMemHandle_t*, void*) = nullptr;
  cudaError_t (*cudaIpcOpenMemHandle)(void**, cudaIpcMemHandle_t, unsigned int) = nullptr;
  cudaError_t (*cudaIpcCloseMemHandle)(void*) = nullptr;
  cudaError_t (*cudaGetLastError)() = nullptr;
  cudaError_t (*cudaPeekAtLastError)() = nullptr;
};
const RuntimeApi& runtimeApi();

// The one table of the driver entry points the shim hands out its own function for, when the
// program looks them up by name (dlsym on libcuda's handle, cuGetProcAddress): the exported
// name; the base name cuGetProcAddress is asked with ("": not answered there); whether its
// per-thread-default-stream variant is taken too (cuLaunchKernel's is left to CUPTI: strict
// mode does not cover it; alloc_path_symbols.h's ProcLookup for entries with a _ptsz of their
// own).
// interpose.cpp generates every list of these names from it.
// cuGetProcAddress itself (v1; cuda.h makes the name a macro for _v2) is handled beside it.
#define DELTA_MANAGED_DRIVER_SYMBOLS(X)                   \
  X(cuMemAlloc_v2, "cuMemAlloc", true)                    \
  X(cuMemFree_v2, "cuMemFree", true)                      \
  X(cuMemGetInfo_v2, "cuMemGetInfo", true)                \
  X(cuMemCreate, "cuMemCreate", true)                     \
  X(cuMemRelease, "cuMemRelease", true)                   \
  X(cuMemMap, "cuMemMap", true)                           \
  X(cuMemUnmap, "cuMemUnmap", true)                       \
  X(cuMemSetAccess, "cuMemSetAccess", true)               \
  X(cuMemExportToShareableHandle, "cuMemExportToShareableHandle", true) \
  X(cuMemGetAllocationPropertiesFromHandle, "cuMemGetAllocationPropertiesFromHandle", true) \
  X(cuMemRetainAllocationHandle, "cuMemRetainAllocationHandle", true) \
  X(cuIpcGetMemHandle, "cuIpcGetMemHandle", true)         \
  X(cuIpcOpenMemHandle_v2, "cuIpcOpenMemHandle", true)    \
  X(cuIpcCloseMemHandle, "cuIpcCloseMemHandle", true)     \
  X(cuLaunchKernel, "cuLaunchKernel", false)              \
  X(cuGetProcAddress_v2, "", false)                       \
  DELTA_ALLOC_PATH_SYMBOLS(X)

// The real versions of the driver functions in that table, as the program would have got them.
struct InterceptedDriver {
#define DELTA_DECLARE_SLOT(name, procBase, perThreadToo) decltype(&::name) name = nullptr;
  DELTA_MANAGED_DRIVER_SYMBOLS(DELTA_DECLARE_SLOT)
#undef DELTA_DECLARE_SLOT
};
InterceptedDriver& interceptedDriver();

// Text of a CUresult for messages.
const char* resultText(const DriverApi& api, CUresult result);

}  // namespace delta::shim
